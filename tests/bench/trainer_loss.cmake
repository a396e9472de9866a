# Chunked vs naive log-prob + loss: peak memory and time side by side.
if(NOT TARGET tandem_model)
  return()
endif()
if(NOT TARGET tandem_trainer_loss)
  add_subdirectory(${PROJECT_SOURCE_DIR}/services/trainer/loss
    ${PROJECT_BINARY_DIR}/trainer_loss_standalone)
endif()
add_executable(trainer_loss_bench ${CMAKE_CURRENT_SOURCE_DIR}/trainer_loss_bench.cc)
target_link_libraries(trainer_loss_bench PRIVATE tandem_trainer_loss)
