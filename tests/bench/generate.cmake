# Generation throughput of the engine on a Hugging Face model directory
# (decode at batch B, prefill), one JSON line per case: Tandem's side of
# the race against llama.cpp and transformers (tests/bench/peer_engines.py).
add_executable(generate_bench ${CMAKE_CURRENT_SOURCE_DIR}/generate_bench.cc)
target_link_libraries(generate_bench PRIVATE tandem_engine_torch
                      absl::strings)

# One decode step's products by the row kernel's paths against at::linear
# and the weight-left form (see row_gemm_bench.cc for flags).
add_executable(row_gemm_bench ${CMAKE_CURRENT_SOURCE_DIR}/row_gemm_bench.cc)
target_link_libraries(row_gemm_bench PRIVATE tandem_kernels tandem_base torch
                      absl::strings)
tandem_use_aten_pch(row_gemm_bench)
