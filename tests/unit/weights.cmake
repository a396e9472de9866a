tandem_add_test(weights_test
  SOURCES
    ${CMAKE_CURRENT_SOURCE_DIR}/flat_weight_layout_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/staging_weights_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/weights_digest_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/weights_tree_digest_test.cc
  LIBS tandem_weights tandem_weights_testing)
# The tree digest's reference: hashlib in tree_digest_reference.py.
target_compile_definitions(weights_test PRIVATE
  TANDEM_TEST_PYTHON="${TANDEM_PYTHON}"
  TANDEM_TREE_DIGEST_REFERENCE="${CMAKE_CURRENT_SOURCE_DIR}/tree_digest_reference.py")
tandem_add_test(weights_pull_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_pull_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/weights_raw_bounds_test.cc
  LIBS tandem_weights_grpc)
# The weight server's roles under mTLS (issue 25 item 3).
tandem_add_test(weights_authz_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_authz_test.cc
  LIBS tandem_weights_grpc tandem_weights_testing tandem_rpc tandem_certs
    prometheus-cpp::core)
# The raw data path's per-epoch challenge-response.
tandem_add_test(weights_data_plane_auth_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_data_plane_auth_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/weights_data_plane_key_grace_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/weights_data_plane_seal_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/weights_raw_auth_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/weights_raw_seal_test.cc
  LIBS tandem_weights_grpc)
# CUDA IPC negotiation, offer checks, leases and the ring, without a device.
tandem_add_test(weights_cuda_ipc_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_cuda_ipc_test.cc
  LIBS tandem_weights_grpc)
tandem_add_test(weights_shm_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_shm_test.cc
  LIBS tandem_weights_grpc)
tandem_add_test(weights_gloo_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_gloo_test.cc
  LIBS tandem_weights_gloo
  TIMEOUT 120)
# Sealed broadcast under mTLS (issue 25 item 3): nothing in the clear.
tandem_add_test(weights_gloo_seal_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_gloo_seal_test.cc
  LIBS tandem_weights_gloo
  TIMEOUT 120)
tandem_add_test(weights_gloo_dying_peer_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_gloo_dying_peer_test.cc
  LIBS tandem_weights_gloo
  TIMEOUT 120)
tandem_add_test(weights_store_client_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_store_client_test.cc
  LIBS tandem_weights_gloo
  TIMEOUT 120)
# The broadcast rendezvous store over the trainer's gRPC (issue 25 item 3).
tandem_add_test(weights_rendezvous_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_rendezvous_test.cc
  LIBS tandem_trainer_rendezvous tandem_rpc tandem_certs prometheus-cpp::core)
