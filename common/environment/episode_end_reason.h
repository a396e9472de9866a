#pragma once

// Why a multi-turn episode ended (tandem.v1.EpisodeEndReason) as a bounded
// metric label. Both ends of the Environment protocol count episodes by it:
// the reward verifier for the episodes its built-in environments host, the
// rollout worker for the episodes it drives, so their `reason` labels
// agree. Each daemon adds labels of its own for ends the protocol does not
// carry (the verifier's "closed" and "idle", the worker's "turn_limit",
// ...). Thread-safe (constant data).

#include <string>

#include "absl/strings/string_view.h"
#include "tandem/v1/environment.pb.h"

namespace tandem::environment {

struct EndReasonEntry {
  tandem::v1::EpisodeEndReason reason;
  absl::string_view label;
};

// Every EpisodeEndReason but EPISODE_END_REASON_UNSPECIFIED (not ended), in
// the enum's order: the closed set of labels a daemon exports at 0.
inline constexpr EndReasonEntry kEndReasonTable[] = {
    {tandem::v1::EPISODE_END_ANSWERED, "answered"},
    {tandem::v1::EPISODE_END_ENVIRONMENT, "environment"},
    {tandem::v1::EPISODE_END_MAX_TURNS, "max_turns"},
    {tandem::v1::EPISODE_END_OBSERVATION_TOO_LARGE, "observation_too_large"},
    {tandem::v1::EPISODE_END_TIMEOUT, "timeout"},
    {tandem::v1::EPISODE_END_ERROR, "error"},
};

// The label of `reason` in kEndReasonTable; `otherwise` (one of the
// table's labels, chosen by the caller) for EPISODE_END_REASON_UNSPECIFIED
// and for values this build does not know.
absl::string_view EndReasonLabel(tandem::v1::EpisodeEndReason reason,
                                 absl::string_view otherwise);

// The table's labels joined by ", " in its order, for metric help texts.
std::string EndReasonLabelList();

}  // namespace tandem::environment
