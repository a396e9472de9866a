tandem_add_test(kernels_test
  SOURCES
    ${CMAKE_CURRENT_SOURCE_DIR}/crc32c_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/bf16_delta_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/finite_scan_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/row_gemm_test.cc
  LIBS tandem_kernels)
if(TANDEM_ENABLE_CUDA)
  tandem_add_test(kernels_cuda_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/bf16_delta_cuda_test.cc
      ${CMAKE_CURRENT_SOURCE_DIR}/crc32c_cuda_test.cc
    LIBS tandem_kernels tandem_kernels_cuda
    LABELS gpu)
endif()
