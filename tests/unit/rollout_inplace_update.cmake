# The rollout worker's inplace weight update mode
# (services/rollout/weight_update_sources.h, InplaceWeightSource).
tandem_add_test(rollout_inplace_update_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_inplace_update_test.cc
  LIBS tandem_rollout_weights
  TIMEOUT 120)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(rollout_inplace_update_test)
