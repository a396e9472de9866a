# Rollout engine throughput: static vs continuous batching, drain vs
# inflight weight updates (the Olmo 3 table), on the built-in tiny model.
add_executable(engine_bench ${CMAKE_CURRENT_SOURCE_DIR}/engine_bench.cc)
target_link_libraries(engine_bench PRIVATE tandem_rollout_weights)
# LibTorch benchmark: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(engine_bench)
