// What most of Tandem's translation units without LibTorch include: gRPC,
// Protobuf, Abseil, spdlog, the standard library and the generated headers
// of the tandem.v1 services. No hand-written header of ours goes here (a
// change to one would rebuild every unit); a .proto change rebuilds nearly
// every unit anyway. cmake/TandemGrpcPch.cmake precompiles it once.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "tandem/v1/environment.grpc.pb.h"
#include "tandem/v1/rollout.grpc.pb.h"
#include "tandem/v1/trainer.grpc.pb.h"
#include "tandem/v1/verifier.grpc.pb.h"
