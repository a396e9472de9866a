tandem_add_test(grpc_client_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/grpc_client_test.cc
  LIBS tandem_coordinator_lib)
