if(TARGET tandem_ctl_model_tools)
  tandem_add_test(tandemctl_model_tools_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tandemctl_model_tools_test.cc
    LIBS tandem_ctl_model_tools)
endif()
