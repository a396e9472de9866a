# The trainer's configuration keys (services/trainer/trainer_config) and
# the best held-out policy it keeps (services/trainer/best_policy).
tandem_add_test(trainer_config_test
  SOURCES
    ${CMAKE_CURRENT_SOURCE_DIR}/trainer_config_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/trainer_best_policy_test.cc
  LIBS tandem_trainer_lib)
