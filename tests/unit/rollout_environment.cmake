# rollout_environment_client_test: the rollout worker's non-blocking
# Environment client against the real verifier daemon in process (a
# calculator episode), an environment that hangs (step deadline), Stop()
# with a call in flight, and an address nobody serves.
tandem_add_test(rollout_environment_client_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_environment_client_test.cc
  LIBS tandem_rollout_environment tandem_verifier_lib
  TIMEOUT 120)
