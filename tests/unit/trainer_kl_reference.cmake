# KL penalty to a frozen reference policy (services/trainer/reference_policy,
# GrpoTrainer::SetReferencePolicy, training.kl_beta / reference_model).
tandem_add_test(trainer_kl_reference_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_kl_reference_test.cc
  LIBS tandem_trainer_lib
  TIMEOUT 300)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(trainer_kl_reference_test)
