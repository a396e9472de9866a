# Conversion of pulled training batches (services/trainer/training_batch.h).
if(NOT TARGET tandem_trainer_lib)
  return()
endif()
tandem_add_test(trainer_training_batch_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_training_batch_test.cc
  LIBS tandem_trainer_lib)
