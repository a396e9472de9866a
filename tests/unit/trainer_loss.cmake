# Trainer losses (services/trainer/loss): chunked log-probs against the naive
# full-logits computation, and the GRPO-family loss on hand-computed cases.
tandem_add_test(trainer_loss_test
  SOURCES
    ${CMAKE_CURRENT_SOURCE_DIR}/trainer_loss_logprobs_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/trainer_loss_grpo_test.cc
  LIBS tandem_trainer_loss
  TIMEOUT 120)
tandem_use_torch_pch(trainer_loss_test)
