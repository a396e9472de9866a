# tandemctl's status and worker calls and the retry policy of --timeout,
# on a fake clock (services/tandemctl/remote_calls.h). No LibTorch.
tandem_add_test(tandemctl_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tandemctl_test.cc
  LIBS tandem_ctl_calls)
