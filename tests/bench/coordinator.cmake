# Control-plane capacity (run through coordinator_bench.sh).
add_executable(coordinator_bench ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_bench.cc)
target_link_libraries(coordinator_bench PRIVATE tandem_rpc tandem_proto)
