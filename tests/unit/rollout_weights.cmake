tandem_add_test(rollout_weight_subscriber_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_weight_subscriber_test.cc
  LIBS tandem_rollout_weights)
# LibTorch test: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_aten_pch(rollout_weight_subscriber_test)
# Sealed broadcast (issue 25 item 3): a refused version is pulled instead.
tandem_add_test(rollout_weight_subscriber_seal_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_weight_subscriber_seal_test.cc
  LIBS tandem_rollout_weights
  TIMEOUT 120)
tandem_use_aten_pch(rollout_weight_subscriber_seal_test)
# Device go-live (issue 22): versions pulled by CUDA IPC go live from the
# sink's copy; a host-memory sink stands in for the device.
tandem_add_test(rollout_weight_subscriber_device_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_weight_subscriber_device_test.cc
  LIBS tandem_rollout_weights
  TIMEOUT 120)
tandem_use_aten_pch(rollout_weight_subscriber_device_test)
# Device broadcast receive (issue 22 item 4): broadcasts into a device
# buffer go live as views of it; host memory stands in for the device.
if(TARGET tandem_weights_cuda)
  tandem_add_test(rollout_weight_subscriber_broadcast_device_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rollout_weight_subscriber_broadcast_device_test.cc
    LIBS tandem_rollout_weights
    TIMEOUT 180)
  tandem_use_aten_pch(rollout_weight_subscriber_broadcast_device_test)
endif()
