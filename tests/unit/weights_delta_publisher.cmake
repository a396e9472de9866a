# The trainer's choice between a sparse bf16 delta and a full anchor per
# published version (common/weights/delta_publisher.h).
tandem_add_test(weights_delta_publisher_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/weights_delta_publisher_test.cc
  LIBS tandem_weights
  TIMEOUT 60)
