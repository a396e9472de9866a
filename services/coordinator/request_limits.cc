#include "services/coordinator/request_limits.h"

#include <string_view>

#include "absl/container/flat_hash_map.h"

namespace tandem::coordinator {
namespace {

FieldLimits Bytes(size_t n) { return {std::nullopt, n}; }
FieldLimits Entries(size_t n) { return {n, std::nullopt}; }
FieldLimits EntriesOfBytes(size_t entries, size_t bytes) {
  return {entries, bytes};
}

// Every string, repeated and map field reachable from a Coordinator request.
const absl::flat_hash_map<std::string_view, FieldLimits>& Fields() {
  static const auto* table = new absl::flat_hash_map<std::string_view,
                                                     FieldLimits>{
      // Register
      {"tandem.v1.RegisterRequest.grpc_address", Bytes(kMaxAddressBytes)},
      {"tandem.v1.RegisterRequest.metrics_address", Bytes(kMaxAddressBytes)},
      {"tandem.v1.RegisterRequest.hostname", Bytes(kMaxHostnameBytes)},
      {"tandem.v1.RegisterRequest.capabilities", Entries(kMaxCapabilities)},
      {"tandem.v1.RegisterRequest.CapabilitiesEntry.key",
       Bytes(kMaxCapabilityKeyBytes)},
      {"tandem.v1.RegisterRequest.CapabilitiesEntry.value",
       Bytes(kMaxCapabilityValueBytes)},
      {"tandem.v1.RegisterRequest.previous_member_id", Bytes(kMaxIdBytes)},
      // Membership
      {"tandem.v1.HeartbeatRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.DeregisterRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.DeregisterRequest.reason", Bytes(kMaxReasonBytes)},
      // Leases
      {"tandem.v1.LeasePromptsRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.LeasePromptsRequest.exclude_environments",
       EntriesOfBytes(kMaxExcludedEnvironments, kMaxIdBytes)},
      {"tandem.v1.RenewLeasesRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.RenewLeasesRequest.lease_ids",
       EntriesOfBytes(kMaxLeaseIdsPerCall, kMaxIdBytes)},
      {"tandem.v1.ReturnLeasesRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.ReturnLeasesRequest.lease_ids",
       EntriesOfBytes(kMaxLeaseIdsPerCall, kMaxIdBytes)},
      {"tandem.v1.ReturnLeasesRequest.reason", Bytes(kMaxReasonBytes)},
      // Samples
      {"tandem.v1.SubmitSamplesRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.SubmitSamplesRequest.samples", Entries(kMaxSamplesPerSubmit)},
      {"tandem.v1.Sample.sample_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.Sample.lease_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.Sample.group_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.Sample.completion_token_ids", Entries(kMaxCompletionTokens)},
      {"tandem.v1.Sample.behavior_logprobs", Entries(kMaxCompletionTokens)},
      {"tandem.v1.Sample.version_spans", Entries(kMaxCompletionTokens)},
      {"tandem.v1.Sample.source_spans", Entries(kMaxCompletionTokens)},
      {"tandem.v1.Sample.completion_text", Bytes(kMaxCompletionTextBytes)},
      {"tandem.v1.Sample.worker_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.Sample.episode_end_reason", Bytes(kMaxIdBytes)},
      {"tandem.v1.Sample.episode_end_text", Bytes(kMaxReasonBytes)},
      // Training batches and versions
      {"tandem.v1.PullTrainingBatchRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.CommitTrainingBatchRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.CommitTrainingBatchRequest.batch_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.ReleaseTrainingBatchRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.ReleaseTrainingBatchRequest.batch_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.ReleaseTrainingBatchRequest.reason", Bytes(kMaxReasonBytes)},
      {"tandem.v1.PublishPolicyVersionRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.PublishPolicyVersionRequest.weight_server_address",
       Bytes(kMaxAddressBytes)},
      {"tandem.v1.PublishPolicyVersionRequest.batch_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.ResumeTrainingRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.WeightManifest.tensors", Entries(kMaxManifestTensors)},
      {"tandem.v1.WeightManifest.buckets", Entries(kMaxManifestBuckets)},
      // SHA-256 digests: of the whole buffer, and the tree root.
      {"tandem.v1.WeightManifest.sha256", Bytes(32)},
      {"tandem.v1.WeightManifest.tree_sha256", Bytes(32)},
      {"tandem.v1.TensorSpec.name", Bytes(kMaxTensorNameBytes)},
      {"tandem.v1.TensorSpec.shape", Entries(kMaxTensorRank)},
      // Cluster watch and weight groups
      {"tandem.v1.WatchClusterRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.SyncWeightGroupRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.SyncWeightGroupRequest.failure", Bytes(kMaxReasonBytes)},
  };
  return *table;
}

const rpc::FieldLimitsTable& Table() {
  static const auto* table =
      new rpc::FieldLimitsTable{Fields(), kDefaultMaxBytes, kDefaultMaxEntries};
  return *table;
}

}  // namespace

std::optional<FieldLimits> LimitsOf(
    const google::protobuf::FieldDescriptor& field) {
  return Table().Find(field);
}

absl::Status CheckRequestLimits(const google::protobuf::Message& request) {
  return rpc::CheckFieldLimits(request, Table());
}

}  // namespace tandem::coordinator
