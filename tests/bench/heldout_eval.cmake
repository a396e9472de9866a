# Held-out evaluation time (greedy exact match through the engine) on the
# built-in task, for docs/benchmarks.md.
add_executable(heldout_eval_bench
               ${CMAKE_CURRENT_SOURCE_DIR}/heldout_eval_bench.cc)
target_link_libraries(heldout_eval_bench PRIVATE tandem_trainer_sft
                      absl::strings absl::time)
