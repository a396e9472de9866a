tandem_add_test(member_registry_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/member_registry_test.cc
  LIBS tandem_coordinator_lib)
tandem_add_test(coordinator_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_ledger_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_staleness_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_dataset_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_scoring_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_journal_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_publish_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_episodes_test.cc
  LIBS tandem_coordinator_lib)
tandem_add_test(coordinator_watch_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_watch_test.cc
  LIBS tandem_coordinator_lib tandem_cluster)
tandem_add_test(coordinator_validation_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_validation_test.cc
  LIBS tandem_coordinator_lib)
# The coordinator's RPC -> role table (issue 25, authorization).
tandem_add_test(coordinator_authz_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_authz_test.cc
  LIBS tandem_coordinator_lib)
