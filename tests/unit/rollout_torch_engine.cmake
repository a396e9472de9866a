tandem_add_test(rollout_torch_engine_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_torch_engine_test.cc
  LIBS tandem_rollout_weights)
# Sampling on the logits' device (engine/torch_sampler.h) against the host
# sampler.
tandem_add_test(engine_torch_sampler_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/engine_torch_sampler_test.cc
  LIBS tandem_engine_torch)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(engine_torch_sampler_test rollout_torch_engine_test)
