# Model core unit tests (common/model). Tiny random models only.
tandem_add_test(model_test
  SOURCES
    ${CMAKE_CURRENT_SOURCE_DIR}/model_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/model_checkpoint_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/model_reference_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/model_attention_grad_test.cc
  LIBS tandem_model
  TIMEOUT 120)
tandem_use_aten_pch(model_test)
# The paged KV cache against the contiguous one (common/model/paged_kv_cache.h)
# and the paged decode attention against the gather path (paged_attention.h).
tandem_add_test(model_paged_kv_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_paged_kv_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/model_paged_attention_test.cc
  LIBS tandem_model
  TIMEOUT 120)
tandem_use_aten_pch(model_paged_kv_test)
