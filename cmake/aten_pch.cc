// The translation unit of tandem_aten_pch (cmake/TandemTorchPch.cmake): it
// exists so that CMake builds the shared precompiled <ATen/ATen.h>.
#include <ATen/ATen.h>
