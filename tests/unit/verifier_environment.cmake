# Environments hosted by the verifier (services/verifier/environment): the
# calculator evaluator and the episode limits.
tandem_add_test(verifier_environment_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/verifier_environment_test.cc
  LIBS tandem_verifier_environment)
