tandem_add_test(model_tools_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_tools_test.cc
  LIBS tandem_model_tools)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_aten_pch(model_tools_test)
