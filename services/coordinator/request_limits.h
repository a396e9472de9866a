#pragma once

// Size limits (common/rpc/field_limits.h) on every string and repeated (or
// map) field of every request of the tandem.v1.Coordinator service, checked
// at the RPC boundary before anything else looks at the request. gRPC's own
// cap (64 MiB per message, common/rpc/grpc_server.cc) bounds a request as a
// whole; these bound each field, so that one member cannot make the
// coordinator store, journal or repeat (GetClusterStatus, WatchCluster,
// Register responses) tens of megabytes on its behalf. Each limit is far above what a well-behaved
// daemon sends (see the constants); a request over one is refused with
// INVALID_ARGUMENT naming the field path, its size and the limit.
//
// The table of limits, by field, is in request_limits.cc; a unit test
// (coordinator_limits_test) checks that it lists every string, repeated and
// map field reachable from every Coordinator request, so a field added to
// the proto without a limit fails the build's tests.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/rpc/field_limits.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace tandem::coordinator {

// Ids the coordinator or a member chose: member, lease, group, sample,
// batch and worker ids (ours are < 64 bytes).
inline constexpr size_t kMaxIdBytes = 256;
// host:port addresses (DNS names are at most 253 bytes).
inline constexpr size_t kMaxAddressBytes = 512;
// RegisterRequest.hostname (Linux HOST_NAME_MAX is 64).
inline constexpr size_t kMaxHostnameBytes = 255;
// Free text for logs: Deregister/ReturnLeases/ReleaseTrainingBatch
// reasons, a failed broadcast's error message.
inline constexpr size_t kMaxReasonBytes = 4096;
// RegisterRequest.capabilities: entries, key and value bytes.
inline constexpr size_t kMaxCapabilities = 64;
inline constexpr size_t kMaxCapabilityKeyBytes = 128;
inline constexpr size_t kMaxCapabilityValueBytes = 4096;
// Leases named in one RenewLeases / ReturnLeases call.
inline constexpr size_t kMaxLeaseIdsPerCall = 4096;
// Environments one LeasePrompts call excludes.
inline constexpr size_t kMaxExcludedEnvironments = 16;
// Samples in one SubmitSamples call (the rollout worker sends up to 64).
inline constexpr size_t kMaxSamplesPerSubmit = 1024;
// Completion tokens of one sample, and so its behavior log-probs and
// version spans (a span covers at least one token).
inline constexpr size_t kMaxCompletionTokens = 131072;
// A sample's decoded completion text.
inline constexpr size_t kMaxCompletionTextBytes = 4 << 20;
// A published WeightManifest: tensors (large MoE checkpoints have tens of
// thousands), each tensor's name and rank, and buckets.
inline constexpr size_t kMaxManifestTensors = 1 << 20;
inline constexpr size_t kMaxTensorNameBytes = 1024;
inline constexpr size_t kMaxTensorRank = 16;
inline constexpr size_t kMaxManifestBuckets = 1 << 20;

using rpc::FieldLimits;
// Nullopt when the table does not list the field.
std::optional<FieldLimits> LimitsOf(const google::protobuf::FieldDescriptor&);

// What a field the table does not list gets (a field added to the proto
// since; the unit test asks for an explicit entry).
inline constexpr size_t kDefaultMaxBytes = 4096;
inline constexpr size_t kDefaultMaxEntries = 4096;

// Checks every set field of `request`, recursively, against the table.
// InvalidArgument names the path, e.g. "RegisterRequest.hostname is
// 41943040 bytes; the limit is 255", or "SubmitSamplesRequest.samples[3].
// completion_token_ids has 200000 entries; the limit is 131072". A field
// the table does not list is held to the defaults above.
absl::Status CheckRequestLimits(const google::protobuf::Message& request);

}  // namespace tandem::coordinator
