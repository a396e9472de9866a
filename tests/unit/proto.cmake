tandem_add_test(proto_roundtrip_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/proto_roundtrip_test.cc LIBS tandem_proto)
