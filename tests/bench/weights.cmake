# Transport throughput (pull and Gloo broadcast) against a raw socket copy.
add_executable(weights_transport_bench
  ${CMAKE_CURRENT_SOURCE_DIR}/weights_transport_bench.cc)
target_link_libraries(weights_transport_bench PRIVATE tandem_weights_gloo
  tandem_weights_grpc)

# Cost of the finite check on received weights against copy and CRC-32C.
add_executable(finite_scan_bench
  ${CMAKE_CURRENT_SOURCE_DIR}/finite_scan_bench.cc)
target_link_libraries(finite_scan_bench PRIVATE tandem_weights
  tandem_weights_testing)

# Epoch formation over the TCPStore against the gRPC rendezvous store (mTLS).
add_executable(rendezvous_bench ${CMAKE_CURRENT_SOURCE_DIR}/rendezvous_bench.cc)
target_link_libraries(rendezvous_bench PRIVATE tandem_weights_gloo
  tandem_trainer_rendezvous tandem_certs)

# Cost of the SHA-256 of each version on the publish path (issue 25 item 3).
add_executable(weight_digest_bench
  ${CMAKE_CURRENT_SOURCE_DIR}/weight_digest_bench.cc)
target_link_libraries(weight_digest_bench PRIVATE tandem_weights)

# The tree digest against the plain SHA-256 on the host, and on the device
# against a device-to-device copy where the CUDA kernels are built and a
# GPU is (tree_digest.h).
add_executable(tree_digest_bench
  ${CMAKE_CURRENT_SOURCE_DIR}/tree_digest_bench.cc)
target_link_libraries(tree_digest_bench PRIVATE tandem_weights)
if(TARGET tandem_kernels_cuda)
  target_link_libraries(tree_digest_bench PRIVATE tandem_kernels_cuda)
  target_compile_definitions(tree_digest_bench PRIVATE TANDEM_TREE_BENCH_CUDA=1)
else()
  target_compile_definitions(tree_digest_bench PRIVATE TANDEM_TREE_BENCH_CUDA=0)
endif()

# The staged update mode's build of the engine's weights from a committed
# version: copying the flat buffer against viewing it (issue 21 item 6).
add_executable(staged_swap_bench
  ${CMAKE_CURRENT_SOURCE_DIR}/staged_swap_bench.cc)
target_link_libraries(staged_swap_bench PRIVATE tandem_weights_model)

# CUDA IPC publish-to-live the way a worker goes live on the device, stage
# by stage, against a device-to-device copy (GPU; says why and exits 0
# without a device). Two processes: tests/gpu/cuda_ipc_pair.h. --cpu runs
# the same go-live and swap on CPU tensors: ctest runs it small as a smoke
# of the stage breakdown (not timed, not a GPU number).
add_executable(cuda_ipc_bench ${CMAKE_CURRENT_SOURCE_DIR}/cuda_ipc_bench.cc)
target_link_libraries(cuda_ipc_bench PRIVATE tandem_weights_cuda_ipc
  tandem_weights_model tandem_rollout_weights)
tandem_use_aten_pch(cuda_ipc_bench)
add_test(NAME bench_cuda_ipc_cpu_smoke
  COMMAND cuda_ipc_bench --cpu --mib 16 --versions 3)
set_tests_properties(bench_cuda_ipc_cpu_smoke PROPERTIES LABELS "unit"
  TIMEOUT 120)

# Going live from a staged tensor on the CPU: TensorSha256 and the CRC +
# finite checks per GiB against a memcpy (device_go_live.h).
add_executable(device_go_live_bench
  ${CMAKE_CURRENT_SOURCE_DIR}/device_go_live_bench.cc)
target_link_libraries(device_go_live_bench PRIVATE tandem_weights_model)
tandem_use_aten_pch(device_go_live_bench)
