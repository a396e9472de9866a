# The OpenAI endpoint's request parsing and validation (no I/O): malformed
# JSON, wrong types, out-of-range values, stop lists, refused fields.
tandem_add_test(rollout_openai_protocol_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_openai_protocol_test.cc
  LIBS tandem_rollout_openai)

# ChoiceAssembler: streamed tool calls (a header, then argument fragments,
# no markup as content) equal to the non-streaming choice; malformed calls.
tandem_add_test(rollout_openai_choices_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_openai_choices_test.cc
  LIBS tandem_rollout_openai)

# ServingQueue: served requests through a real Engine (toy model) beside
# rollout requests; tokens, versions, cancellation, refusal, shutdown.
tandem_add_test(rollout_serving_queue_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_serving_queue_test.cc
  LIBS tandem_rollout_openai)

# PrepareRequest: prompt encoding, token id and context checks, sampling
# parameters (no I/O, the built-in tokenizer).
tandem_add_test(rollout_openai_prompt_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_openai_prompt_test.cc
  LIBS tandem_rollout_openai tandem_task)

# HarnessEpisodes and its HTTP routes (no I/O): claims, turns that do or do
# not extend an episode, the samples of a finished group, finish twice,
# abort and idle expiry giving the lease back.
tandem_add_test(rollout_harness_episodes_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_harness_episodes_test.cc
  LIBS tandem_rollout_openai)
