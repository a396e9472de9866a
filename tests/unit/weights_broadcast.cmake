tandem_add_test(weights_broadcast_sender_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_broadcast_sender_test.cc
  LIBS tandem_weights_gloo
  TIMEOUT 120)
tandem_add_test(weights_broadcast_group_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_broadcast_group_test.cc
  LIBS tandem_weights_gloo
  TIMEOUT 120)
# Gloo groups through the rendezvous store over the trainer's gRPC (mTLS).
tandem_add_test(weights_gloo_grpc_rendezvous_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_gloo_grpc_rendezvous_test.cc
  LIBS tandem_weights_gloo tandem_trainer_rendezvous tandem_certs
  TIMEOUT 120)
