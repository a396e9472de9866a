tandem_add_test(rollout_worker_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_worker_test.cc
  LIBS tandem_rollout_lib tandem_coordinator_lib tandem_health_proto)
# The worker's lease and submit loops against a scripted coordinator
# (tests/support/fake_coordinator_client.h): no coordinator, no LibTorch
# model.
tandem_add_test(rollout_lease_submit_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_lease_submit_test.cc
  LIBS tandem_rollout_leases)
