# The trainer daemon's published float32 versions are its master weights
# (services/trainer/training_loop_publish.cc), byte for byte.
tandem_add_test(trainer_publish_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_publish_test.cc
  LIBS tandem_trainer_lib
  TIMEOUT 300)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(trainer_publish_test)
# The GPU cases (device copy, device deltas, NCCL to a device receiver)
# need the device weight sync (CUDA and NCCL builds); they skip with a
# warning without a CUDA device (tests/gpu/run.sh reports them).
if(TARGET tandem_weights_cuda)
  target_compile_definitions(trainer_publish_test PRIVATE
    TANDEM_TEST_DEVICE_SYNC=1)
  # The worker's half: a subscriber receiving into device memory.
  target_link_libraries(trainer_publish_test PRIVATE tandem_rollout_weights)
endif()
