tandem_add_test(logging_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/logging_test.cc
  LIBS tandem_base nlohmann_json::nlohmann_json)
