tandem_add_test(member_registry_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/member_registry_test.cc
  LIBS tandem_coordinator_lib)
