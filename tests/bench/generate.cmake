# Generation throughput of the engine on a Hugging Face model directory
# (decode at batch B, prefill), one JSON line per case: Tandem's side of
# the race against llama.cpp and transformers (tests/bench/peer_engines.py).
add_executable(generate_bench ${CMAKE_CURRENT_SOURCE_DIR}/generate_bench.cc)
target_link_libraries(generate_bench PRIVATE tandem_engine_torch
                      absl::strings)
