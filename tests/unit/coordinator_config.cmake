tandem_add_test(coordinator_config_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_config_test.cc
  LIBS tandem_coordinator_lib)
