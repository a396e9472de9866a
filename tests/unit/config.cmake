tandem_add_test(config_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/config_test.cc
  LIBS tandem_config)
