tandem_add_test(model_tools_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_tools_test.cc
  LIBS tandem_model_tools)
