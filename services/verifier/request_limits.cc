#include "services/verifier/request_limits.h"

namespace tandem::verifier {

const rpc::FieldLimitsTable& VerifierRequestLimits() {
  static const auto* table = new rpc::FieldLimitsTable{{
      // ScoreBatch
      {"tandem.v1.ScoreBatchRequest.items", rpc::MaxEntries(kMaxScoreItems)},
      {"tandem.v1.ScoreItem.item_id", rpc::MaxBytes(kMaxItemIdBytes)},
      {"tandem.v1.ScoreItem.verifier", rpc::MaxBytes(kMaxVerifierNameBytes)},
      {"tandem.v1.ScoreItem.prompt_text", rpc::MaxBytes(kMaxItemTextBytes)},
      {"tandem.v1.ScoreItem.completion_text", rpc::MaxBytes(kMaxItemTextBytes)},
      {"tandem.v1.ScoreItem.metadata", rpc::MaxEntries(kMaxMetadataEntries)},
      {"tandem.v1.ScoreItem.MetadataEntry.key",
       rpc::MaxBytes(kMaxMetadataKeyBytes)},
      {"tandem.v1.ScoreItem.MetadataEntry.value",
       rpc::MaxBytes(kMaxMetadataValueBytes)},
      // ListVerifiers has no fields.
  }};
  return *table;
}

absl::Status CheckVerifierRequestLimits(
    const google::protobuf::Message& request) {
  return rpc::CheckFieldLimits(request, VerifierRequestLimits());
}

}  // namespace tandem::verifier
