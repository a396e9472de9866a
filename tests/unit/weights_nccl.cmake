# NCCL broadcast transport (common/weights/nccl_broadcast_transport.h), only
# in builds with TANDEM_ENABLE_NCCL. The error paths without a device run
# everywhere; the GPU parts pass with a warning without two CUDA devices.
if(TARGET tandem_weights_nccl)
  tandem_add_test(weights_nccl_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_nccl_test.cc
    LIBS tandem_weights_nccl tandem_weights_gloo
    LABELS gpu
    TIMEOUT 180)
endif()
