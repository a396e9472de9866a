# GRPO with an in-process rollout learns the built-in task (issue 6): a
# warm start, then a few hundred RL steps; the slowest unit test (minutes).
tandem_add_test(trainer_inprocess_rl_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_inprocess_rl_test.cc
  LIBS tandem_trainer_tools
  TIMEOUT 1200)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_aten_pch(trainer_inprocess_rl_test)
