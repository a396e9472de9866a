#include "services/coordinator/sample_validation.h"

#include <cmath>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "services/coordinator/episode_rules.h"
#include "services/coordinator/request_limits.h"

namespace tandem::coordinator {
namespace {

constexpr char kRefusalPayload[] = "tandem.coordinator.SubmitRefusal";

absl::Status Invalid(SubmitRefusal reason, std::string message) {
  return Refuse(reason, absl::StatusCode::kInvalidArgument, std::move(message));
}

// Multi-turn episodes: the source spans (if any) cover every completion
// token, each span is non-empty with a known source, and the model
// produced at least one token (an episode with nothing to train is not a
// sample).
absl::Status ValidateSourceSpans(const tandem::v1::Sample& sample, int i) {
  if (sample.source_spans_size() == 0) return absl::OkStatus();
  uint64_t covered = 0, model = 0;
  for (int s = 0; s < sample.source_spans_size(); ++s) {
    const tandem::v1::SourceSpan& span = sample.source_spans(s);
    if (span.num_tokens() == 0) {
      return Invalid(SubmitRefusal::kSourceSpans,
                     absl::StrCat("samples[", i, "].source_spans[", s,
                                  "].num_tokens is 0; spans cover >= 1 token"));
    }
    if (span.source() != tandem::v1::TOKEN_SOURCE_MODEL &&
        span.source() != tandem::v1::TOKEN_SOURCE_ENVIRONMENT) {
      return Invalid(SubmitRefusal::kSourceSpans,
                     absl::StrCat("samples[", i, "].source_spans[", s,
                                  "].source is ", span.source(),
                                  ", not a known TokenSource"));
    }
    covered += span.num_tokens();
    if (span.source() == tandem::v1::TOKEN_SOURCE_MODEL) {
      model += span.num_tokens();
    }
  }
  const int tokens = sample.completion_token_ids_size();
  if (covered != static_cast<uint64_t>(tokens)) {
    return Invalid(
        SubmitRefusal::kSourceSpans,
        absl::StrCat("samples[", i, "].source_spans cover ", covered,
                     " tokens, the sample has ", tokens, " completion tokens"));
  }
  if (model == 0) {
    return Invalid(SubmitRefusal::kSourceSpans,
                   absl::StrCat("samples[", i,
                                "].source_spans give every token to the "
                                "environment; a sample needs at least one "
                                "token of the model"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSample(const tandem::v1::Sample& sample, int i) {
  if (sample.lease_id().empty()) {
    return Invalid(SubmitRefusal::kMissingLease,
                   absl::StrCat("samples[", i, "].lease_id is empty"));
  }
  const int tokens = sample.completion_token_ids_size();
  if (sample.behavior_logprobs_size() != tokens) {
    return Invalid(
        SubmitRefusal::kLogprobCount,
        absl::StrCat("samples[", i, "].behavior_logprobs has ",
                     sample.behavior_logprobs_size(), " entries for ", tokens,
                     " completion tokens; one per token is required"));
  }
  for (int k = 0; k < tokens; ++k) {
    const float logprob = sample.behavior_logprobs(k);
    if (!std::isfinite(logprob) || logprob > 0.0f) {
      return Invalid(
          SubmitRefusal::kLogprobValue,
          absl::StrCat("samples[", i, "].behavior_logprobs[", k, "] is ",
                       logprob, "; log-probs must be finite and <= 0"));
    }
    if (sample.completion_token_ids(k) < 0) {
      return Invalid(
          SubmitRefusal::kTokenId,
          absl::StrCat("samples[", i, "].completion_token_ids[", k, "] is ",
                       sample.completion_token_ids(k), "; token ids are >= 0"));
    }
  }
  uint64_t covered = 0;
  for (int s = 0; s < sample.version_spans_size(); ++s) {
    const tandem::v1::VersionSpan& span = sample.version_spans(s);
    if (span.num_tokens() == 0) {
      return Invalid(SubmitRefusal::kVersionSpans,
                     absl::StrCat("samples[", i, "].version_spans[", s,
                                  "].num_tokens is 0; spans cover >= 1 token"));
    }
    if (s > 0 &&
        span.policy_version() < sample.version_spans(s - 1).policy_version()) {
      return Invalid(SubmitRefusal::kVersionSpans,
                     absl::StrCat("samples[", i, "].version_spans[", s,
                                  "].policy_version is ", span.policy_version(),
                                  ", older than the span before it (",
                                  sample.version_spans(s - 1).policy_version(),
                                  "); versions only grow along a sample"));
    }
    covered += span.num_tokens();
  }
  if (covered != static_cast<uint64_t>(tokens)) {
    return Invalid(
        SubmitRefusal::kVersionSpans,
        absl::StrCat("samples[", i, "].version_spans cover ", covered,
                     " tokens, the sample has ", tokens, " completion tokens"));
  }
  RETURN_IF_ERROR(ValidateSourceSpans(sample, i));
  return ValidateEpisodeFields(sample, i);
}

}  // namespace

const char* SubmitRefusalLabel(SubmitRefusal reason) {
  switch (reason) {
    case SubmitRefusal::kTooLarge:
      return "too_large";
    case SubmitRefusal::kMissingLease:
      return "missing_lease";
    case SubmitRefusal::kLogprobCount:
      return "logprob_count";
    case SubmitRefusal::kLogprobValue:
      return "logprob_value";
    case SubmitRefusal::kTokenId:
      return "token_id";
    case SubmitRefusal::kVersionSpans:
      return "version_spans";
    case SubmitRefusal::kVersionRange:
      return "version_range";
    case SubmitRefusal::kLeaseNotHeld:
      return "lease_not_held";
    case SubmitRefusal::kSourceSpans:
      return "source_spans";
    case SubmitRefusal::kEpisode:
      return "episode";
  }
  return "unknown";
}

absl::Status Refuse(SubmitRefusal reason, absl::StatusCode code,
                    std::string message) {
  absl::Status status(code, message);
  status.SetPayload(kRefusalPayload,
                    absl::Cord(absl::StrCat(static_cast<int>(reason))));
  return status;
}

std::optional<SubmitRefusal> RefusalOf(const absl::Status& status) {
  auto payload = status.GetPayload(kRefusalPayload);
  if (!payload) return std::nullopt;
  for (SubmitRefusal reason : kAllSubmitRefusals) {
    if (*payload == absl::StrCat(static_cast<int>(reason))) return reason;
  }
  return std::nullopt;
}

absl::Status ValidateSubmitRequest(
    const tandem::v1::SubmitSamplesRequest& request) {
  if (absl::Status status = CheckRequestLimits(request); !status.ok()) {
    return Refuse(SubmitRefusal::kTooLarge, status.code(),
                  std::string(status.message()));
  }
  for (int i = 0; i < request.samples_size(); ++i) {
    if (absl::Status status = ValidateSample(request.samples(i), i);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSampleVersions(const tandem::v1::Sample& sample, int index,
                                    uint64_t oldest, uint64_t newest) {
  for (int s = 0; s < sample.version_spans_size(); ++s) {
    const uint64_t version = sample.version_spans(s).policy_version();
    if (version < oldest || version > newest) {
      return Invalid(
          SubmitRefusal::kVersionRange,
          absl::StrCat("samples[", index, "].version_spans[", s,
                       "].policy_version is ", version,
                       "; allowed for this lease: ", oldest, " to ", newest,
                       " (its dispatch version minus max_lag to the "
                       "published version plus ",
                       kVersionsAheadAllowed, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::coordinator
