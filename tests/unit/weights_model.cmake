tandem_add_test(weights_model_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_model_test.cc
  LIBS tandem_weights_model tandem_weights_device_model tandem_weights_grpc)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_aten_pch(weights_model_test)

tandem_add_test(device_digest_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/device_digest_test.cc
  LIBS tandem_weights_model)
tandem_use_aten_pch(device_digest_test)

# Going live from a staged (device) tensor, on the CPU (device_go_live.h).
tandem_add_test(weights_device_go_live_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_device_go_live_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/weights_device_go_live_tree_test.cc
  LIBS tandem_weights_model)
tandem_use_aten_pch(weights_device_go_live_test)
