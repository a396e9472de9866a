// The translation unit of tandem_grpc_pch (cmake/TandemGrpcPch.cmake): it
// exists so that CMake builds the shared precompiled gRPC header.
#include "cmake/grpc_pch.h"
