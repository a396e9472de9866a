#include "services/verifier/environment/environment_request_limits.h"

namespace tandem::verifier {
namespace {

constexpr size_t kNameBytes = 128;      // Environment, verifier, episode id.
constexpr size_t kIdBytes = 256;        // Task id, tool call id and name.
constexpr size_t kTextBytes = 4 << 20;  // Prompt, action text, metadata.
constexpr size_t kArgumentsBytes = 1 << 20;

}  // namespace

const rpc::FieldLimitsTable& EnvironmentRequestLimits() {
  static const auto* table = new rpc::FieldLimitsTable{{
      // OpenEpisode
      {"tandem.v1.OpenEpisodeRequest.environment", rpc::MaxBytes(kNameBytes)},
      {"tandem.v1.OpenEpisodeRequest.task_id", rpc::MaxBytes(kIdBytes)},
      {"tandem.v1.OpenEpisodeRequest.prompt_text", rpc::MaxBytes(kTextBytes)},
      {"tandem.v1.OpenEpisodeRequest.verifier", rpc::MaxBytes(kNameBytes)},
      {"tandem.v1.OpenEpisodeRequest.metadata", rpc::MaxEntries(64)},
      {"tandem.v1.OpenEpisodeRequest.MetadataEntry.key", rpc::MaxBytes(128)},
      {"tandem.v1.OpenEpisodeRequest.MetadataEntry.value",
       rpc::MaxBytes(kTextBytes)},
      // Step
      {"tandem.v1.StepRequest.episode_id", rpc::MaxBytes(kNameBytes)},
      {"tandem.v1.Action.text", rpc::MaxBytes(kTextBytes)},
      {"tandem.v1.Action.tool_calls", rpc::MaxEntries(1024)},
      {"tandem.v1.ToolCall.id", rpc::MaxBytes(kIdBytes)},
      {"tandem.v1.ToolCall.name", rpc::MaxBytes(kIdBytes)},
      {"tandem.v1.ToolCall.arguments_json", rpc::MaxBytes(kArgumentsBytes)},
      // CloseEpisode
      {"tandem.v1.CloseEpisodeRequest.episode_id", rpc::MaxBytes(kNameBytes)},
      // ListEnvironments has no fields.
  }};
  return *table;
}

absl::Status CheckEnvironmentRequestLimits(
    const google::protobuf::Message& request) {
  return rpc::CheckFieldLimits(request, EnvironmentRequestLimits());
}

}  // namespace tandem::verifier
