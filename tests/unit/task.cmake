# The built-in arithmetic task and its character-level tokenizer.
tandem_add_test(task_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/task_test.cc
  LIBS tandem_task)

# The built-in multi-turn tools task (problems, split, exact-match answer).
tandem_add_test(tools_task_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tools_task_test.cc
  LIBS tandem_task tandem_chat)

# The tools task as tokens: tokenizer, chat template, demonstration spans.
tandem_add_test(tools_demonstration_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tools_demonstration_test.cc
  LIBS tandem_tools_demonstration tandem_chat nlohmann_json::nlohmann_json)
