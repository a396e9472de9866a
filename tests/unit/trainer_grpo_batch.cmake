# Which completions a GRPO step trains on (services/trainer/rl/grpo_batch):
# no LibTorch.
tandem_add_test(trainer_grpo_batch_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_grpo_batch_test.cc
  LIBS tandem_trainer_grpo_batch)
