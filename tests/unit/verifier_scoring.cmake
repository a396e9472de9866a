# Scoring library of the reward verifier (services/verifier/scoring).
tandem_add_test(verifier_scoring_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/verifier_scoring_test.cc
  LIBS tandem_verifier_scoring)
# Runs untrusted programs in the sandbox; the namespace tests need root.
tandem_add_test(verifier_sandbox_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/verifier_sandbox_test.cc
  LIBS tandem_verifier_scoring
  TIMEOUT 120)
