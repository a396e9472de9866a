# KL penalty to a frozen reference policy (services/trainer/reference_policy,
# GrpoTrainer::SetReferencePolicy, training.kl_beta / reference_model).
if(NOT TARGET tandem_trainer_lib)
  return()
endif()
tandem_add_test(trainer_kl_reference_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_kl_reference_test.cc
  LIBS tandem_trainer_lib
  TIMEOUT 300)
