# Chunked vs naive log-prob + loss: peak memory and time side by side.
add_executable(trainer_loss_bench ${CMAKE_CURRENT_SOURCE_DIR}/trainer_loss_bench.cc)
target_link_libraries(trainer_loss_bench PRIVATE tandem_trainer_loss)
# LibTorch benchmark: a shared precompiled header (cmake/TandemTorchPch.cmake).
tandem_use_torch_pch(trainer_loss_bench)
