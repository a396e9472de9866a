tandem_add_test(metrics_exposition_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/metrics_exposition_test.cc
  LIBS tandem_metrics tandem_coordinator_lib tandem_rollout_metrics)
