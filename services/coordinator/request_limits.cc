#include "services/coordinator/request_limits.h"

#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace tandem::coordinator {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

FieldLimits Bytes(size_t n) { return {std::nullopt, n}; }
FieldLimits Entries(size_t n) { return {n, std::nullopt}; }
FieldLimits EntriesOfBytes(size_t entries, size_t bytes) {
  return {entries, bytes};
}

// Every string, repeated and map field reachable from a Coordinator request.
const absl::flat_hash_map<std::string_view, FieldLimits>& Table() {
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
      {"tandem.v1.Sample.completion_text", Bytes(kMaxCompletionTextBytes)},
      {"tandem.v1.Sample.worker_id", Bytes(kMaxIdBytes)},
      // Training batches and versions
      {"tandem.v1.PullTrainingBatchRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.CommitTrainingBatchRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.CommitTrainingBatchRequest.batch_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.PublishPolicyVersionRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.PublishPolicyVersionRequest.weight_server_address",
       Bytes(kMaxAddressBytes)},
      {"tandem.v1.PublishPolicyVersionRequest.batch_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.ResumeTrainingRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.WeightManifest.tensors", Entries(kMaxManifestTensors)},
      {"tandem.v1.WeightManifest.buckets", Entries(kMaxManifestBuckets)},
      {"tandem.v1.TensorSpec.name", Bytes(kMaxTensorNameBytes)},
      {"tandem.v1.TensorSpec.shape", Entries(kMaxTensorRank)},
      // Cluster watch and weight groups
      {"tandem.v1.WatchClusterRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.SyncWeightGroupRequest.member_id", Bytes(kMaxIdBytes)},
      {"tandem.v1.SyncWeightGroupRequest.failure", Bytes(kMaxReasonBytes)},
  };
  return *table;
}

// A field's place in the request, for messages: "samples[3].lease_id".
std::string Path(const std::string& parent, const FieldDescriptor& field,
                 int index = -1) {
  std::string out =
      parent.empty() ? field.name() : absl::StrCat(parent, ".", field.name());
  if (index >= 0) absl::StrAppend(&out, "[", index, "]");
  return out;
}

absl::Status TooManyEntries(const std::string& path, size_t size,
                            size_t limit) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, " has ", size, " entries; the limit is ", limit));
}

absl::Status TooManyBytes(const std::string& path, size_t size, size_t limit) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, " is ", size, " bytes; the limit is ", limit));
}

absl::Status Check(const Message& message, const std::string& path) {
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const bool is_string = field->cpp_type() == FieldDescriptor::CPPTYPE_STRING;
    const bool is_message =
        field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (!field->is_repeated() && !is_string && !is_message) continue;
    const std::optional<FieldLimits> listed = LimitsOf(*field);
    const size_t max_entries = listed && listed->max_entries
                                   ? *listed->max_entries
                                   : kDefaultMaxEntries;
    const size_t max_bytes =
        listed && listed->max_bytes ? *listed->max_bytes : kDefaultMaxBytes;
    if (field->is_repeated()) {
      const int n = reflection->FieldSize(message, field);
      if (static_cast<size_t>(n) > max_entries) {
        return TooManyEntries(Path(path, *field), static_cast<size_t>(n),
                              max_entries);
      }
      if (is_string) {
        std::string scratch;
        for (int i = 0; i < n; ++i) {
          const std::string& value = reflection->GetRepeatedStringReference(
              message, field, i, &scratch);
          if (value.size() > max_bytes) {
            return TooManyBytes(Path(path, *field, i), value.size(), max_bytes);
          }
        }
      } else if (is_message) {
        for (int i = 0; i < n; ++i) {
          const Message& element =
              reflection->GetRepeatedMessage(message, field, i);
          absl::Status status =
              Check(element, field->is_map() ? Path(path, *field)
                                             : Path(path, *field, i));
          if (!status.ok()) return status;
        }
      }
    } else if (is_string) {
      std::string scratch;
      const std::string& value =
          reflection->GetStringReference(message, field, &scratch);
      if (value.size() > max_bytes) {
        return TooManyBytes(Path(path, *field), value.size(), max_bytes);
      }
    } else {
      absl::Status status =
          Check(reflection->GetMessage(message, field), Path(path, *field));
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<FieldLimits> LimitsOf(const FieldDescriptor& field) {
  auto it = Table().find(field.full_name());
  if (it == Table().end()) return std::nullopt;
  return it->second;
}

absl::Status CheckRequestLimits(const Message& request) {
  return Check(request, request.GetDescriptor()->name());
}

}  // namespace tandem::coordinator
