# GrpoTrainer's learning-rate schedule (warmup + constant / cosine /
# linear), gradient accumulation over micro-batches, dynamic sampling and
# reference guidance (services/trainer/rl).
tandem_add_test(trainer_rl_schedule_test
  SOURCES
    ${CMAKE_CURRENT_SOURCE_DIR}/trainer_lr_schedule_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/trainer_micro_batch_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/trainer_dynamic_sampling_test.cc
  LIBS tandem_trainer_rl
  TIMEOUT 120)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(trainer_rl_schedule_test)
