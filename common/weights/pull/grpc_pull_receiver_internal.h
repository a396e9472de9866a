#pragma once

// Helpers shared by the files of GrpcPullReceiver (grpc_pull_receiver.cc:
// planning, long poll, gRPC stream; grpc_pull_raw.cc: raw TCP stream and
// shared memory; grpc_pull_cuda_ipc.cc: CUDA IPC). Not for other users.

#include <cstdint>

#include "absl/status/status.h"
#include "tandem/v1/trainer.pb.h"

namespace tandem::weights::pull_internal {

// A whole raw bucket is read (and a shared-memory segment copied) and
// checksummed in pieces of this size, each checksummed while it is still in
// cache. Small reads also move the bytes faster: side by side on the 2-core
// loopback of docs/benchmarks.md ("Raw pull in 128 KiB pieces") a raw pull
// in 128 KiB pieces ran 0.86-1.26x a plain socket copy, against 0.69-0.88x
// in 4 MiB pieces.
constexpr uint64_t kRawPieceBytes = uint64_t{128} << 10;

absl::Status CancelledStatus();

// The request for `manifest`'s payload from (bucket, offset) on: the same
// on both paths, so resume semantics cannot drift apart.
v1::FetchWeightsRequest ResumeRequest(const v1::WeightManifest& manifest,
                                      uint32_t bucket, uint64_t offset,
                                      uint32_t chunk_bytes);

bool IsFull(const v1::WeightManifest& m);

}  // namespace tandem::weights::pull_internal
