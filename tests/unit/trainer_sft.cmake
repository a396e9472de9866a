# Supervised warm start (services/trainer/sft): a small variant of the
# built-in task that trains in the unit-test budget.
tandem_add_test(trainer_sft_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_sft_test.cc
  LIBS tandem_trainer_sft
  TIMEOUT 180)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_aten_pch(trainer_sft_test)

# The tools task's warm start pieces: demonstration packing, the episode
# evaluation and its calculator.
tandem_add_test(trainer_sft_tools_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_sft_tools_test.cc
  LIBS tandem_trainer_sft
  TIMEOUT 120)
tandem_use_aten_pch(trainer_sft_tools_test)
