# The verifier daemon in process, through its gRPC surface.
tandem_add_test(verifier_service_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/verifier_service_test.cc
  LIBS tandem_verifier_lib
  TIMEOUT 120)
