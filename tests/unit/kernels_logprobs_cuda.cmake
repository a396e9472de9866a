# GPU test of the CUDA token log-prob kernels (kernels/cuda); skips without
# a device.
if(TANDEM_ENABLE_CUDA)
  tandem_add_test(kernels_logprobs_cuda_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/token_logprobs_cuda_test.cc
    LIBS tandem_kernels_cuda
    LABELS gpu)
endif()
