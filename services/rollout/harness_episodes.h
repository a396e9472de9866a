#pragma once

// HarnessEpisodes is the bookkeeping of episodes that an agent harness
// drives through the OpenAI endpoint (docs/openai-endpoint.md, "Training
// a black-box agent"): the rollout worker offers every sample of a lease
// whose environment is openai.harness_environment as one episode; a
// harness claims it over HTTP, sends its model turns as chat/completion
// requests carrying the episode id, and finishes it with a reward.
//
// An episode's tokens are the lease's prompt, then per model turn the
// tokens the harness added since the last turn (the environment's: masked
// out of the loss) and the tokens the engine sampled (the model's: trained,
// with their behaviour log-probs and policy versions). Turn k+1's prompt
// must extend turn k's prompt and completion exactly; a prompt that does
// not is refused, naming the first differing position.
//
// A group (a lease) is handed to the worker for submission once every one
// of its episodes has finished; until then nothing of it is submitted, so
// an aborted or expired episode gives the whole lease back to the
// coordinator (the way a dying worker's lease comes back) and nothing of
// it can be trained twice.
//
// Thread-safe: the HTTP thread claims, records turns and finishes; the
// engine thread offers leases and takes finished groups and abandoned
// leases.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/environment/reward_range.h"
#include "engine/engine.h"

namespace tandem::rollout {

struct HarnessOptions {
  // An episode with no claim, turn or finish for this long is abandoned
  // (its lease goes back to the coordinator).
  absl::Duration idle_timeout = absl::Seconds(60);
  // An episode's whole life, from the offer of its lease: past it the
  // lease goes back to the coordinator even while the harness is active
  // (a turn in flight included). Infinite = no bound.
  absl::Duration max_lifetime = absl::InfiniteDuration();
  // Episodes held (offered, claimed, or finished and waiting for their
  // group) before the worker stops taking leases; a lease offered at it is
  // refused (one offered just below it may pass it by its group size - 1).
  int32_t max_episodes = 64;
  // The clock of the idle and lifetime limits (common/base/clock.h): what
  // Now() reads, and what CancelTurn stamps. Outlives the episodes.
  Clock* clock = RealClock();
};

// One leased task, as the worker hands it over (a PromptLease's fields).
struct HarnessTask {
  std::string lease_id;
  std::string group_id;
  std::string task_id;  // the dataset row's id
  std::string prompt_text;
  std::vector<int32_t> prompt;
  int32_t group_size = 1;
  double temperature = 1.0;
  int64_t max_tokens = 0;  // the lease's; 0 = unset
  std::string verifier;
  std::map<std::string, std::string> metadata;
  // The range a :finish reward must be in (PromptLease.reward_range).
  environment::RewardRange reward_range;
};

// A finished episode for submission: `sample.request_id` is the lease id.
struct HarnessSample {
  engine::FinishedSample sample;
  double reward = 0;
};

// Why a lease was given back (a metric label: HarnessReturnLabel).
enum class HarnessReturn { kAborted, kIdleTimeout, kLifetime };
const char* HarnessReturnLabel(HarnessReturn why);
inline constexpr HarnessReturn kHarnessReturns[] = {HarnessReturn::kAborted,
                                                    HarnessReturn::kIdleTimeout,
                                                    HarnessReturn::kLifetime};

struct HarnessAbandoned {
  std::string lease_id;
  HarnessReturn why = HarnessReturn::kAborted;
  std::string reason;  // for the log and the coordinator
};

// Episodes held, by state, and turns since the last TakeCounts.
struct HarnessCounts {
  int32_t unclaimed = 0;
  int32_t claimed = 0;   // claimed and not finished
  int32_t finished = 0;  // waiting for the rest of their group
  int64_t turns_accepted = 0;
  int64_t turns_refused = 0;
};

// What a claim hands the harness.
struct HarnessClaim {
  std::string episode_id;
  int32_t sample_index = 0;
  HarnessTask task;
};

class HarnessEpisodes {
 public:
  // `policy_version` returns the worker's live version (the version
  // recorded for the environment's tokens).
  HarnessEpisodes(HarnessOptions options,
                  std::function<uint64_t()> policy_version);

  const HarnessOptions& options() const { return options_; }
  // The time on options.clock: what callers pass as `now` below (the
  // HTTP routes, the worker's offers and expiry scans).
  absl::Time Now() const { return options_.clock->Now(); }

  // ---- Engine thread. ----
  // Offers the task's group_size episodes. RESOURCE_EXHAUSTED when full(),
  // INVALID_ARGUMENT for a lease already offered.
  absl::Status Offer(HarnessTask task, absl::Time now);
  // Groups whose episodes have all finished, each sample in index order.
  std::vector<std::vector<HarnessSample>> TakeFinishedGroups();
  // Leases given up since the last call (an episode aborted, idle for
  // options.idle_timeout, or older than options.max_lifetime as of `now`),
  // with the reason; their episodes are gone. (No lease deadline: the
  // worker's heartbeats renew its leases while it lives.) Walks the
  // episodes only once the earliest deadline has passed.
  std::vector<HarnessAbandoned> TakeAbandoned(absl::Time now);
  // Episodes held by state; the turn counts since the previous call.
  HarnessCounts TakeCounts();
  // Drops every group, finished ones not yet taken included; returns their
  // lease ids.
  std::vector<std::string> AbortAll(const std::string& reason);
  // Episodes held.
  int32_t active() const;
  // At options.max_episodes: the worker takes no lease.
  bool full() const { return active() >= options_.max_episodes; }

  // ---- HTTP thread. ----
  // The next unclaimed episode, or nullopt.
  std::optional<HarnessClaim> Claim(absl::Time now);
  // A model turn of `episode_id` starts: `request_id` is the served
  // request that will sample it from `prompt` at `temperature`. NOT_FOUND
  // for an unknown episode, FAILED_PRECONDITION for one that ended or has
  // a turn in flight, INVALID_ARGUMENT for a prompt that does not extend
  // the episode's tokens or a temperature other than the lease's.
  absl::Status BeginTurn(const std::string& episode_id,
                         const std::string& request_id,
                         const std::vector<int32_t>& prompt, double temperature,
                         absl::Time now);
  // The turn's sampled tokens, as the response returns them. Ignored when
  // the episode or the turn is gone.
  void EndTurn(const std::string& episode_id, const std::string& request_id,
               const std::vector<int32_t>& tokens,
               const std::vector<float>& logprobs,
               const std::vector<uint64_t>& versions,
               const std::string& finish_reason, absl::Time now);
  // The turn failed (timeout, client gone, engine error): nothing of it is
  // recorded; the episode goes on from its previous tokens.
  void CancelTurn(const std::string& episode_id, const std::string& request_id);
  // Ends the episode with `reward` (finite, in [0, 1]). NOT_FOUND unknown,
  // FAILED_PRECONDITION ended or a turn in flight, INVALID_ARGUMENT for the
  // reward or an episode without a token of the model.
  absl::Status Finish(const std::string& episode_id, double reward,
                      absl::Time now);
  // Gives the episode's whole lease back to the coordinator.
  absl::Status Abort(const std::string& episode_id, const std::string& reason);

 private:
  struct Episode {
    std::string id;
    std::string lease_id;
    int32_t index = 0;
    bool claimed = false;
    bool finished = false;
    absl::Time offered;
    absl::Time last_activity;
    // The lease's prompt, then every token since: the next turn's prompt
    // must start with all of it.
    std::vector<int32_t> context;
    // Per token after the lease's prompt.
    std::vector<float> logprobs;
    std::vector<uint64_t> versions;
    std::vector<engine::TokenSource> sources;
    int32_t turns = 0;
    std::string in_flight;  // the served request of the running turn
    std::string last_finish;
    double reward = 0;
    absl::Time admitted, first_token;
  };
  struct Group {
    HarnessTask task;
    std::vector<std::string> episode_ids;
  };

  // The episode or the error that names why there is none.
  absl::StatusOr<Episode*> Find(const std::string& episode_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BeginTurnLocked(const std::string& episode_id,
                               const std::string& request_id,
                               const std::vector<int32_t>& prompt,
                               double temperature, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the group and its episodes, remembering why they ended.
  void DropGroup(const std::string& lease_id, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberEnded(const std::string& episode_id, std::string reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  HarnessSample ToSample(const Episode& e, const Group& g) const;
  // `e` had activity: the next expiry scan is due no later than its new
  // idle deadline.
  void Touched(Episode& e, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether and why `e` has expired as of `now`.
  std::optional<HarnessAbandoned> Expired(const Episode& e,
                                          absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When `e` would expire if nothing happens (InfiniteFuture for none).
  absl::Time Deadline(const Episode& e) const;

  const HarnessOptions options_;
  const std::function<uint64_t()> policy_version_;
  const std::string id_prefix_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // By lease id.
  std::map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Episode> episodes_ ABSL_GUARDED_BY(mu_);
  // Unclaimed episode ids, in offer order.
  std::deque<std::string> unclaimed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<HarnessSample>> finished_groups_ ABSL_GUARDED_BY(mu_);
  std::vector<HarnessAbandoned> abandoned_ ABSL_GUARDED_BY(mu_);
  // No episode expires before this (TakeAbandoned's scans wait for it).
  absl::Time next_expiry_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int64_t turns_accepted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t turns_refused_ ABSL_GUARDED_BY(mu_) = 0;
  // Why recently ended episodes ended (bounded, oldest dropped first), so a
  // late call is answered with the reason rather than "unknown".
  std::map<std::string, std::string> ended_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::rollout
