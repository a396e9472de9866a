# Delta sync benchmarks: codec size and speed on synthetic changes, and the
# changed fraction of real AdamW steps on a bf16 model (LibTorch).
add_executable(delta_bench ${CMAKE_CURRENT_SOURCE_DIR}/delta_bench.cc)
target_link_libraries(delta_bench PRIVATE tandem_kernels absl::strings
  absl::str_format)

add_executable(delta_adamw_bench ${CMAKE_CURRENT_SOURCE_DIR}/delta_adamw_bench.cc)
target_link_libraries(delta_adamw_bench PRIVATE tandem_kernels
  absl::str_format torch c10)
# LibTorch benchmark: a shared precompiled header (cmake/TandemTorchPch.cmake).
# tandem_base only for its compile definitions (spdlog, fmt), which the
# header was built with: GCC refuses the header without them.
target_link_libraries(delta_adamw_bench PRIVATE tandem_base)
tandem_use_torch_pch(delta_adamw_bench)
