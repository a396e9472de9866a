# NCCL broadcast of device memory against a GPU-to-GPU copy (issue 22 item
# 6; run by tests/gpu/run.sh with two or more GPUs).
if(TARGET tandem_weights_cuda)
  add_executable(nccl_broadcast_bench
    ${CMAKE_CURRENT_SOURCE_DIR}/nccl_broadcast_bench.cc)
  target_link_libraries(nccl_broadcast_bench PRIVATE tandem_weights_cuda
    tandem_weights_gloo)
endif()
