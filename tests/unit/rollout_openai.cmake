# The OpenAI endpoint's request parsing and validation (no I/O): malformed
# JSON, wrong types, out-of-range values, stop lists, refused fields.
tandem_add_test(rollout_openai_protocol_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_openai_protocol_test.cc
  LIBS tandem_rollout_openai)
