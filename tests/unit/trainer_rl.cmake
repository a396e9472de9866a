tandem_add_test(trainer_grpo_step_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_grpo_step_test.cc
  LIBS tandem_trainer_rl tandem_engine_torch)
