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
      ${CMAKE_CURRENT_SOURCE_DIR}/sha256_tree_cuda_test.cc
    LIBS tandem_kernels tandem_kernels_cuda
    LABELS gpu)
  # The SHA-256 of the kernels against hashlib (tree_digest_reference.py).
  target_compile_definitions(kernels_cuda_test PRIVATE
    TANDEM_TEST_PYTHON="${TANDEM_PYTHON}"
    TANDEM_TREE_DIGEST_REFERENCE="${CMAKE_CURRENT_SOURCE_DIR}/tree_digest_reference.py")
endif()
