// The translation unit of tandem_torch_pch (cmake/TandemTorchPch.cmake): it
// exists so that CMake builds the shared precompiled <torch/torch.h>.
#include <torch/torch.h>
