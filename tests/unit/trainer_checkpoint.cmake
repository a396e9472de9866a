# Trainer checkpoints, resume and Hugging Face export
# (services/trainer/checkpoint*).
tandem_add_test(trainer_checkpoint_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_checkpoint_test.cc
  LIBS tandem_trainer_tools
  TIMEOUT 180)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(trainer_checkpoint_test)
