#pragma once

// What the coordinator checks in every sample of a SubmitSamples call
// before it changes anything, so that one bad sample cannot poison the
// policy (NaN log-probs make every later loss NaN; a made-up future version
// keeps a group from ever counting as stale):
//
//   field sizes          request_limits.h                   INVALID_ARGUMENT
//   lease_id             set                                INVALID_ARGUMENT
//   behavior_logprobs    one per completion token, each
//                        finite and <= 0                    INVALID_ARGUMENT
//   completion_token_ids each >= 0                          INVALID_ARGUMENT
//   version_spans        each num_tokens > 0, versions
//                        non-decreasing, covering every
//                        completion token exactly (none for
//                        a sample without tokens)           INVALID_ARGUMENT
//   ...versions          within [dispatch version of the
//                        lease - max_lag, published + 1]    INVALID_ARGUMENT
//   lease holder         the submitting member, or the
//                        member it replaced (registered as
//                        previous_member_id) when that one
//                        is gone                            PERMISSION_DENIED
//
// The first three are checked here, on the request alone; the version
// range and the holder need the ledger's state and are checked by
// GroupLedger::Submit under its lock. A refused call changes nothing: no
// sample of it is stored, even the valid ones. Samples of leases that are
// unknown or expired are not refused: they are listed in
// rejected_sample_ids, as before (a slow worker's lost lease is not an
// attack).
//
// A refusal's status carries its reason (below) as a payload, for the
// tandem_coordinator_submit_refusals_total{reason} counter.

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

// Why a SubmitSamples call was refused: the metric's bounded label set.
enum class SubmitRefusal {
  kTooLarge,      // a field over its size limit
  kMissingLease,  // samples[i].lease_id empty
  kLogprobCount,  // behavior_logprobs not one per token
  kLogprobValue,  // a log-prob NaN, infinite or > 0
  kTokenId,       // a negative token id
  kVersionSpans,  // spans malformed: empty, out of order, wrong total
  kVersionRange,  // a span's version outside the allowed range
  kLeaseNotHeld,  // the lease belongs to another member
  kSourceSpans,   // source spans malformed: empty, unknown source, wrong
                  // total, or no model token
  kEpisode,       // environment_reward or episode_end_reason not allowed
                  // here, out of range, or unknown (episode_rules.h)
};
inline constexpr SubmitRefusal kAllSubmitRefusals[] = {
    SubmitRefusal::kTooLarge,     SubmitRefusal::kMissingLease,
    SubmitRefusal::kLogprobCount, SubmitRefusal::kLogprobValue,
    SubmitRefusal::kTokenId,      SubmitRefusal::kVersionSpans,
    SubmitRefusal::kVersionRange, SubmitRefusal::kLeaseNotHeld,
    SubmitRefusal::kSourceSpans,  SubmitRefusal::kEpisode};

// The metric label: too_large, missing_lease, logprob_count, logprob_value,
// token_id, version_spans, version_range, lease_not_held, source_spans,
// episode.
const char* SubmitRefusalLabel(SubmitRefusal reason);

// A status of `code` with `message` that carries `reason`.
absl::Status Refuse(SubmitRefusal reason, absl::StatusCode code,
                    std::string message);
// The reason a status from Refuse() carries; nullopt for any other status.
std::optional<SubmitRefusal> RefusalOf(const absl::Status& status);

// How far ahead of the coordinator's published version a span may be: the
// trainer stores version v+1 on its weight server before the coordinator
// accepts it, and a worker that pulls it in between may finish samples at
// v+1 before the publish lands.
inline constexpr uint64_t kVersionsAheadAllowed = 1;

// The request-only checks (sizes, lease id, log-probs, token ids, span
// shape) of every sample. Messages name the sample and field, e.g.
// "samples[2].behavior_logprobs[5] is nan; log-probs must be finite and
// <= 0".
absl::Status ValidateSubmitRequest(
    const tandem::v1::SubmitSamplesRequest& request);

// The version range check of one sample: every span's version in
// [oldest, newest]. `index` names the sample in messages.
absl::Status ValidateSampleVersions(const tandem::v1::Sample& sample, int index,
                                    uint64_t oldest, uint64_t newest);

}  // namespace tandem::coordinator
