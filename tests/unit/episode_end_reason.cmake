# The shared table of episode end reasons (common/environment).
tandem_add_test(episode_end_reason_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/episode_end_reason_test.cc
  LIBS tandem_environment)
