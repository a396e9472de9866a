tandem_add_test(safetensors_test
  SOURCES
    ${CMAKE_CURRENT_SOURCE_DIR}/safetensors_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/safetensors_malformed_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/sharded_checkpoint_test.cc
  LIBS tandem_safetensors)
