# The built-in arithmetic task and its character-level tokenizer.
tandem_add_test(task_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/task_test.cc
  LIBS tandem_task)
