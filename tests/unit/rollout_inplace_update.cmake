# The rollout worker's inplace weight update mode
# (services/rollout/torch_engine_model.h, InplaceWeightSource).
if(TARGET tandem_rollout_torch)
  tandem_add_test(rollout_inplace_update_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_inplace_update_test.cc
    LIBS tandem_rollout_torch
    TIMEOUT 120)
endif()
