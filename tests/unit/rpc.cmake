tandem_add_test(grpc_client_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/grpc_client_test.cc
  LIBS tandem_coordinator_lib)

tandem_add_test(grpc_server_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/grpc_server_test.cc
  LIBS tandem_rpc tandem_proto)
