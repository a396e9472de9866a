tandem_add_test(weights_long_poll_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_long_poll_test.cc
  LIBS tandem_weights_grpc
  TIMEOUT 120)
