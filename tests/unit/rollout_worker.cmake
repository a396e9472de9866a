tandem_add_test(rollout_worker_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_worker_test.cc
  LIBS tandem_rollout_lib tandem_coordinator_lib tandem_health_proto)
