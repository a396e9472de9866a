# The trainer daemon's published float32 versions are its master weights
# (services/trainer/training_loop_publish.cc), byte for byte.
tandem_add_test(trainer_publish_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_publish_test.cc
  LIBS tandem_trainer_lib
  TIMEOUT 300)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(trainer_publish_test)
