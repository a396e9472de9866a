tandem_add_test(launcher_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/launcher_progress_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/launcher_supervisor_test.cc
  LIBS tandem_launcher_lib)
