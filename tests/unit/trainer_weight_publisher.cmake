# The trainer's WeightPublisher (services/trainer/weight_publisher.h):
# broadcast and the re-send protocol, and its shutdown.
tandem_add_test(trainer_weight_publisher_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/trainer_weight_publisher_test.cc
  LIBS tandem_trainer_lib
  TIMEOUT 120)
