tandem_add_test(broadcast_epochs_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/broadcast_epochs_test.cc
  LIBS tandem_coordinator_lib)
