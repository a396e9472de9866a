#pragma once

// Size limits (common/rpc/field_limits.h) on every string, repeated and map
// field of every request of the tandem.v1.Verifier service, checked when a
// call arrives, before the batch is admitted, validated or scored. A
// request over one is refused with INVALID_ARGUMENT naming the field path,
// its size and the limit (e.g. "ScoreBatchRequest.items[2].completion_text
// is 5000000 bytes; the limit is 4194304"). The coordinator scores such an
// item 0 ("invalid_request") after trying it alone, so it cannot stall its
// group. Each limit is far above what the coordinator sends; a unit test
// (verifier_service_test) checks that the table lists every such field.
//
// The number of items of a batch has two limits: the replica's configured
// max_batch_items (RESOURCE_EXHAUSTED: a well-formed batch that is too
// large for this replica; the coordinator sends its items in smaller
// batches), checked first, and kMaxScoreItems here (the largest
// max_batch_items a replica may be configured with, verifier_config.cc).

#include <cstddef>

#include "absl/status/status.h"
#include "common/rpc/field_limits.h"
#include "google/protobuf/message.h"

namespace tandem::verifier {

// Items of one ScoreBatch call.
inline constexpr size_t kMaxScoreItems = 100000;
// ScoreItem.item_id (the coordinator's sample ids are < 64 bytes).
inline constexpr size_t kMaxItemIdBytes = 256;
// ScoreItem.verifier: a scorer's name.
inline constexpr size_t kMaxVerifierNameBytes = 128;
// ScoreItem.prompt_text and completion_text (the coordinator bounds
// completions at 4 MiB too).
inline constexpr size_t kMaxItemTextBytes = 4 << 20;
// ScoreItem.metadata: entries, key bytes, value bytes (a code item's
// "tests" program is the largest value).
inline constexpr size_t kMaxMetadataEntries = 64;
inline constexpr size_t kMaxMetadataKeyBytes = 128;
inline constexpr size_t kMaxMetadataValueBytes = 4 << 20;

// The verifier's table of limits.
const rpc::FieldLimitsTable& VerifierRequestLimits();

// CheckFieldLimits against the table.
absl::Status CheckVerifierRequestLimits(
    const google::protobuf::Message& request);

}  // namespace tandem::verifier
