# DecoderModel prefill/decode throughput (see model_bench.cc for flags).
add_executable(model_bench ${CMAKE_CURRENT_SOURCE_DIR}/model_bench.cc)
target_link_libraries(model_bench PRIVATE tandem_model)
tandem_use_aten_pch(model_bench)
