tandem_add_test(rollout_torch_engine_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_torch_engine_test.cc
  LIBS tandem_rollout_weights)
