tandem_add_test(rollout_weight_subscriber_watch_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_weight_subscriber_watch_test.cc
  LIBS tandem_rollout_weights tandem_coordinator_lib
  TIMEOUT 120)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_aten_pch(rollout_weight_subscriber_watch_test)
