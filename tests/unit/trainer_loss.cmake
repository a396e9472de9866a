# Trainer losses (services/trainer/loss): chunked log-probs against the naive
# full-logits computation, and the GRPO-family loss on hand-computed cases.
if(NOT TARGET tandem_model)
  return()
endif()
if(NOT TARGET tandem_trainer_loss)
  # Until services/trainer adds the loss directory itself.
  add_subdirectory(${PROJECT_SOURCE_DIR}/services/trainer/loss
    ${PROJECT_BINARY_DIR}/trainer_loss_standalone)
endif()
tandem_add_test(trainer_loss_test
  SOURCES
    ${CMAKE_CURRENT_SOURCE_DIR}/trainer_loss_logprobs_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/trainer_loss_grpo_test.cc
  LIBS tandem_trainer_loss
  TIMEOUT 120)
target_precompile_headers(trainer_loss_test PRIVATE <torch/torch.h>)
