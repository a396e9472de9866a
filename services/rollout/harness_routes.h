#pragma once

// The HTTP routes of harness-driven episodes (docs/openai-endpoint.md,
// "Training a black-box agent"), as JSON in and out, no I/O:
//
//   POST /tandem/v1/episodes:claim          {"wait_ms": 0..60000}
//   POST /tandem/v1/episodes/{id}:finish    {"reward": r}
//   POST /tandem/v1/episodes/{id}:abort     {"reason": "..."}
//
// and the mapping of HarnessEpisodes' errors onto HTTP statuses with
// OpenAI's error body (404 unknown episode, 409 an episode that ended or
// has a turn in flight, 400 bad input).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/rollout/harness_episodes.h"
#include "services/rollout/openai_protocol.h"

namespace tandem::rollout {

// The longest a claim may wait for an episode.
inline constexpr absl::Duration kMaxClaimWait = absl::Seconds(60);

struct HarnessReply {
  // 204 (no body) when a claim found nothing.
  int status = 200;
  openai::Json body;
  // A claim that found nothing yet: the caller retries TryClaim until this
  // much time has passed, then answers 204.
  absl::Duration claim_wait = absl::ZeroDuration();
};

bool IsHarnessPath(std::string_view path);

// Answers a request whose path IsHarnessPath. `episodes` may be null
// (openai.harness_environment unset): every route is then a 404 that names
// the key.
HarnessReply HandleHarnessRequest(HarnessEpisodes* episodes, bool is_post,
                                  std::string_view path, std::string_view body,
                                  absl::Time now);

// The claim response of the next unclaimed episode, or nullopt.
std::optional<openai::Json> TryClaim(HarnessEpisodes* episodes, absl::Time now);

// HarnessEpisodes' status as an OpenAI error (its HTTP status inside).
openai::ApiError HarnessError(const absl::Status& status);

// A completion request with an episode id begins that episode's turn,
// sampled by served request `request_id` from `prompt`; the error to
// answer when refused (or when `episodes` is null). Nothing to do
// without an episode id.
std::optional<openai::ApiError> BeginEpisodeTurn(
    HarnessEpisodes* episodes, const openai::CompletionRequest& request,
    const std::string& request_id, const std::vector<int32_t>& prompt);

// The turn's response `result` (choice 0, as sent), or nullopt when the
// turn failed and records nothing.
void EndEpisodeTurn(HarnessEpisodes* episodes, const std::string& episode_id,
                    const std::string& request_id,
                    const std::optional<openai::ChoiceResult>& result);

}  // namespace tandem::rollout
