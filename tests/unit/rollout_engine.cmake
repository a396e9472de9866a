tandem_add_test(rollout_engine_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_engine_test.cc
  LIBS tandem_engine)
