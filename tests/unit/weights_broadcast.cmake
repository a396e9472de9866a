tandem_add_test(weights_broadcast_sender_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_broadcast_sender_test.cc
  LIBS tandem_weights_gloo
  TIMEOUT 120)
tandem_add_test(weights_broadcast_group_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_broadcast_group_test.cc
  LIBS tandem_weights_gloo
  TIMEOUT 120)
