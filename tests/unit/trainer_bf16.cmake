# A bfloat16 Hugging Face checkpoint trains and is published in bfloat16
# (services/trainer/trainer.cc, the trainer daemon's publish dtype).
tandem_add_test(trainer_bf16_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_bf16_test.cc
  LIBS tandem_trainer_lib
  TIMEOUT 300)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(trainer_bf16_test)
