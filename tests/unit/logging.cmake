tandem_add_test(logging_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/logging_test.cc
  LIBS tandem_base nlohmann_json::nlohmann_json)
# common/base/posix.h: errno and filesystem errors as statuses.
tandem_add_test(posix_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/posix_test.cc
  LIBS tandem_base)
# The clock seam: RealClock and the FakeClock tests advance by hand.
tandem_add_test(clock_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/clock_test.cc
  LIBS tandem_base)
# The pool of threads for the row kernel's column ranges.
tandem_add_test(range_pool_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/range_pool_test.cc
  LIBS tandem_base)
