# Weight sync between device buffers (common/weights/broadcast/
# device_broadcast.h, common/weights/device_delta.h): only in builds with
# CUDA and NCCL. The dispatch runs on the CPU; the GPU cases pass with a
# warning without a CUDA device (tests/gpu/run.sh reports them SKIPPED).
if(TARGET tandem_weights_cuda)
  tandem_add_test(weights_device_sync_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_device_broadcast_test.cc
      ${CMAKE_CURRENT_SOURCE_DIR}/weights_device_delta_test.cc
      ${CMAKE_CURRENT_SOURCE_DIR}/weights_device_nccl_test.cc
      ${CMAKE_CURRENT_SOURCE_DIR}/weights_device_sender_test.cc
    LIBS tandem_weights_cuda tandem_weights_gloo
    LABELS gpu
    TIMEOUT 120)
endif()
