tandem_add_test(grpc_client_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/grpc_client_test.cc
  LIBS tandem_coordinator_lib)

tandem_add_test(grpc_server_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/grpc_server_test.cc
  LIBS tandem_rpc tandem_proto)

# tls.* config checks, the --tls-* flags, and an mtls GrpcServer
# (certificates from tandemctl's certs library).
tandem_add_test(tls_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tls_test.cc
  LIBS tandem_rpc tandem_config tandem_certs tandem_health_proto)

# Role and name from a client certificate's SPIFFE ID (issue 25).
tandem_add_test(peer_identity_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/peer_identity_test.cc
  LIBS tandem_rpc)
