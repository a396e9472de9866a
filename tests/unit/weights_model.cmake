tandem_add_test(weights_model_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_model_test.cc
  LIBS tandem_weights_model tandem_weights_device_model tandem_weights_grpc)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_aten_pch(weights_model_test)

tandem_add_test(device_digest_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/device_digest_test.cc
  LIBS tandem_weights_model)
tandem_use_aten_pch(device_digest_test)
