# Conversion of pulled training batches (services/trainer/training_batch.h).
tandem_add_test(trainer_training_batch_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_training_batch_test.cc
  LIBS tandem_trainer_training_batch)
