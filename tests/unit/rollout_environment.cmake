# rollout_environment_client_test: the rollout worker's non-blocking
# Environment client against the real verifier daemon in process (a
# calculator episode), an environment that hangs (step deadline), Stop()
# with a call in flight, and an address nobody serves.
tandem_add_test(rollout_environment_client_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_environment_client_test.cc
  LIBS tandem_rollout_environment tandem_verifier_lib
  TIMEOUT 120)

# rollout_episode_driver_test: episodes driven on the engine (toy model,
# scripted turn text) against the real verifier's calculator environment:
# a parsed tool call and its observation, a weight update mid-episode, a
# malformed call, the turn limit, a hanging and an unreachable environment.
tandem_add_test(rollout_episode_driver_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_episode_driver_test.cc
  LIBS tandem_rollout_environment tandem_verifier_lib
  TIMEOUT 120)

# rollout_episode_opening_test: opening observations (OpenEpisodeResponse.
# observations) before the first turn, each sample its own, masked; none:
# the same tokens as before; too large, a failed open, a prompt with the
# generation header; a task given back while it waits for its opens.
tandem_add_test(rollout_episode_opening_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_episode_opening_test.cc
  LIBS tandem_rollout_environment tandem_verifier_lib
  TIMEOUT 120)
