tandem_add_test(trainer_grpo_step_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_grpo_step_test.cc
  LIBS tandem_trainer_rl tandem_engine_torch)
# Mixed precision (bf16 compute, fp32 master) and the device/dtype keys.
tandem_add_test(trainer_mixed_precision_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_mixed_precision_test.cc
  LIBS tandem_trainer_rl tandem_engine_torch tandem_rollout_weights)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(trainer_grpo_step_test trainer_mixed_precision_test)
