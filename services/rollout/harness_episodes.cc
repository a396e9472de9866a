#include "services/rollout/harness_episodes.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/environment/reward_range.h"

namespace tandem::rollout {
namespace {

// Ended episode ids remembered for their reason.
constexpr size_t kRememberedEnds = 4096;

std::string RandomPrefix() {
  std::random_device device;
  return absl::StrFormat("ep-%08x-", device());
}

engine::FinishReason FinishReasonOf(const std::string& text) {
  return text == "length" ? engine::FinishReason::kLength
                          : engine::FinishReason::kStop;
}

}  // namespace

const char* HarnessReturnLabel(HarnessReturn why) {
  switch (why) {
    case HarnessReturn::kAborted:
      return "aborted";
    case HarnessReturn::kIdleTimeout:
      return "idle_timeout";
    case HarnessReturn::kLifetime:
      return "lifetime";
  }
  return "aborted";
}

HarnessEpisodes::HarnessEpisodes(HarnessOptions options,
                                 std::function<uint64_t()> policy_version)
    : options_(std::move(options)),
      policy_version_(std::move(policy_version)),
      id_prefix_(RandomPrefix()) {}

absl::Status HarnessEpisodes::Offer(HarnessTask task, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (groups_.count(task.lease_id) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease ", task.lease_id, " is already offered"));
  }
  const int32_t n = std::max(1, task.group_size);
  if (static_cast<int64_t>(episodes_.size()) >= options_.max_episodes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("lease ", task.lease_id, ": ", episodes_.size(),
                     " harness episodes held, openai.harness_max_episodes is ",
                     options_.max_episodes));
  }
  Group& group = groups_[task.lease_id];
  for (int32_t i = 0; i < n; ++i) {
    Episode e;
    e.id = absl::StrCat(id_prefix_, next_id_++);
    e.lease_id = task.lease_id;
    e.index = i;
    e.offered = now;
    e.context = task.prompt;
    Touched(e, now);
    group.episode_ids.push_back(e.id);
    unclaimed_.push_back(e.id);
    std::string id = e.id;
    episodes_.emplace(std::move(id), std::move(e));
  }
  group.task = std::move(task);
  return absl::OkStatus();
}

std::vector<std::vector<HarnessSample>> HarnessEpisodes::TakeFinishedGroups() {
  absl::MutexLock lock(&mu_);
  return std::exchange(finished_groups_, {});
}

std::vector<HarnessAbandoned> HarnessEpisodes::TakeAbandoned(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (now >= next_expiry_) {
    next_expiry_ = absl::InfiniteFuture();
    std::vector<HarnessAbandoned> expired;
    for (const auto& [lease_id, group] : groups_) {
      absl::Time group_deadline = absl::InfiniteFuture();
      bool dropped = false;
      for (const std::string& id : group.episode_ids) {
        const Episode& e = episodes_.at(id);
        std::optional<HarnessAbandoned> why = Expired(e, now);
        if (why.has_value()) {
          expired.push_back(*std::move(why));
          dropped = true;
          break;
        }
        group_deadline = std::min(group_deadline, Deadline(e));
      }
      if (!dropped) next_expiry_ = std::min(next_expiry_, group_deadline);
    }
    for (const HarnessAbandoned& a : expired) {
      DropGroup(a.lease_id, a.reason);
      abandoned_.push_back(a);
    }
  }
  return std::exchange(abandoned_, {});
}

HarnessCounts HarnessEpisodes::TakeCounts() {
  absl::MutexLock lock(&mu_);
  HarnessCounts counts;
  for (const auto& [id, e] : episodes_) {
    if (e.finished) {
      ++counts.finished;
    } else if (e.claimed) {
      ++counts.claimed;
    } else {
      ++counts.unclaimed;
    }
  }
  counts.turns_accepted = std::exchange(turns_accepted_, 0);
  counts.turns_refused = std::exchange(turns_refused_, 0);
  return counts;
}

absl::Time HarnessEpisodes::Deadline(const Episode& e) const {
  const absl::Time lifetime = e.offered + options_.max_lifetime;
  // A finished episode, or one whose turn is in flight (bounded by
  // openai.request_timeout_s), is not idle.
  if (e.finished || !e.in_flight.empty()) return lifetime;
  return std::min(lifetime, e.last_activity + options_.idle_timeout);
}

std::optional<HarnessAbandoned> HarnessEpisodes::Expired(const Episode& e,
                                                         absl::Time now) const {
  if (now - e.offered >= options_.max_lifetime) {
    return HarnessAbandoned{
        .lease_id = e.lease_id,
        .why = HarnessReturn::kLifetime,
        .reason = absl::StrCat("harness episode ", e.id, " offered ",
                               absl::FormatDuration(now - e.offered),
                               " ago, past its limit of ",
                               absl::FormatDuration(options_.max_lifetime),
                               " (openai.harness_max_episode_s)")};
  }
  if (e.finished || !e.in_flight.empty() ||
      now - e.last_activity < options_.idle_timeout) {
    return std::nullopt;
  }
  return HarnessAbandoned{
      .lease_id = e.lease_id,
      .why = HarnessReturn::kIdleTimeout,
      .reason =
          absl::StrCat("harness episode ", e.id, " (",
                       e.claimed ? "claimed" : "never claimed", ") idle for ",
                       absl::FormatDuration(now - e.last_activity),
                       " (openai.harness_idle_timeout_s)")};
}

void HarnessEpisodes::Touched(Episode& e, absl::Time now) {
  e.last_activity = now;
  next_expiry_ = std::min(next_expiry_, Deadline(e));
}

std::vector<std::string> HarnessEpisodes::AbortAll(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> leases;
  for (const auto& [lease_id, group] : groups_) leases.push_back(lease_id);
  for (const std::string& lease_id : leases) DropGroup(lease_id, reason);
  for (HarnessAbandoned& a : std::exchange(abandoned_, {})) {
    leases.push_back(std::move(a.lease_id));
  }
  // Finished since the caller last took them: not submitted, so they go
  // back too.
  for (const std::vector<HarnessSample>& group : finished_groups_) {
    if (!group.empty()) leases.push_back(group.front().sample.request_id);
  }
  finished_groups_.clear();
  return leases;
}

int32_t HarnessEpisodes::active() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(episodes_.size());
}

std::optional<HarnessClaim> HarnessEpisodes::Claim(absl::Time now) {
  absl::MutexLock lock(&mu_);
  while (!unclaimed_.empty()) {
    const std::string id = unclaimed_.front();
    unclaimed_.pop_front();
    auto it = episodes_.find(id);
    if (it == episodes_.end()) continue;  // dropped with its group
    Episode& e = it->second;
    e.claimed = true;
    Touched(e, now);
    return HarnessClaim{.episode_id = id,
                        .sample_index = e.index,
                        .task = groups_.at(e.lease_id).task};
  }
  return std::nullopt;
}

absl::StatusOr<HarnessEpisodes::Episode*> HarnessEpisodes::Find(
    const std::string& episode_id) {
  auto it = episodes_.find(episode_id);
  if (it != episodes_.end()) return &it->second;
  auto ended = ended_.find(episode_id);
  if (ended != ended_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("episode ", episode_id, " has ended: ", ended->second));
  }
  return absl::NotFoundError(absl::StrCat(
      "no episode ", episode_id.substr(0, 128),
      " on this worker (claim one with POST /tandem/v1/episodes:claim)"));
}

absl::Status HarnessEpisodes::BeginTurn(const std::string& episode_id,
                                        const std::string& request_id,
                                        const std::vector<int32_t>& prompt,
                                        double temperature, absl::Time now) {
  absl::MutexLock lock(&mu_);
  absl::Status status =
      BeginTurnLocked(episode_id, request_id, prompt, temperature, now);
  ++(status.ok() ? turns_accepted_ : turns_refused_);
  return status;
}

absl::Status HarnessEpisodes::BeginTurnLocked(
    const std::string& episode_id, const std::string& request_id,
    const std::vector<int32_t>& prompt, double temperature, absl::Time now) {
  auto found = Find(episode_id);
  if (!found.ok()) return found.status();
  Episode& e = **found;
  const HarnessTask& task = groups_.at(e.lease_id).task;
  if (e.finished) {
    return absl::FailedPreconditionError(
        absl::StrCat("episode ", episode_id, " is finished (reward ", e.reward,
                     "); it waits for the other episodes of its group"));
  }
  if (!e.in_flight.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("episode ", episode_id, " has a turn in flight (",
                     e.in_flight, "); send one turn at a time"));
  }
  if (std::abs(temperature - task.temperature) > 1e-6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "episode ", episode_id, ": temperature ", temperature,
        " is not the task's ", task.temperature,
        " (the trainer recomputes log-probs at the task's temperature; "
        "the claim's sampling.temperature says it)"));
  }
  const size_t n = std::min(prompt.size(), e.context.size());
  for (size_t i = 0; i < n; ++i) {
    if (prompt[i] != e.context[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "episode ", episode_id, ": turn ", e.turns + 1,
          "'s prompt does not extend the episode's tokens: it differs at "
          "token position ",
          i, " (the episode has token ", e.context[i], ", the prompt ",
          prompt[i], "; the episode has ", e.context.size(),
          " tokens: the task's prompt, then every earlier prompt's and "
          "completion's)"));
    }
  }
  if (prompt.size() < e.context.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "episode ", episode_id, ": turn ", e.turns + 1, "'s prompt has ",
        prompt.size(), " tokens, fewer than the episode's ", e.context.size(),
        ": it must extend them (it differs at token "
        "position ",
        prompt.size(), ", which it lacks)"));
  }
  // The tokens the harness added since the last turn: the environment's,
  // at the live version; never older than the tokens before them (the
  // published version can lag the engine's by a step), as versions only
  // grow along a sample.
  const uint64_t version =
      std::max(policy_version_(), e.versions.empty() ? 0 : e.versions.back());
  for (size_t i = e.context.size(); i < prompt.size(); ++i) {
    e.context.push_back(prompt[i]);
    e.logprobs.push_back(0.0f);
    e.versions.push_back(version);
    e.sources.push_back(engine::TokenSource::kEnvironment);
  }
  e.in_flight = request_id;
  Touched(e, now);
  if (e.turns == 0) e.admitted = now;
  return absl::OkStatus();
}

void HarnessEpisodes::EndTurn(const std::string& episode_id,
                              const std::string& request_id,
                              const std::vector<int32_t>& tokens,
                              const std::vector<float>& logprobs,
                              const std::vector<uint64_t>& versions,
                              const std::string& finish_reason,
                              absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end() || it->second.in_flight != request_id) return;
  Episode& e = it->second;
  if (e.turns == 0 && !tokens.empty()) e.first_token = now;
  for (size_t i = 0; i < tokens.size(); ++i) {
    e.context.push_back(tokens[i]);
    e.logprobs.push_back(i < logprobs.size() ? logprobs[i] : 0.0f);
    e.versions.push_back(i < versions.size() ? versions[i] : 0);
    e.sources.push_back(engine::TokenSource::kModel);
  }
  ++e.turns;
  e.last_finish = finish_reason;
  e.in_flight.clear();
  Touched(e, now);
}

void HarnessEpisodes::CancelTurn(const std::string& episode_id,
                                 const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end() || it->second.in_flight != request_id) return;
  it->second.in_flight.clear();
  Touched(it->second, Now());
}

absl::Status HarnessEpisodes::Finish(const std::string& episode_id,
                                     double reward, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto found = Find(episode_id);
  if (!found.ok()) return found.status();
  Episode& e = **found;
  if (e.finished) {
    return absl::FailedPreconditionError(
        absl::StrCat("episode ", episode_id, " is already finished (reward ",
                     e.reward, ")"));
  }
  if (!e.in_flight.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("episode ", episode_id, " has a turn in flight (",
                     e.in_flight, "); finish it after the turn's response"));
  }
  auto held = groups_.find(e.lease_id);
  const environment::RewardRange range = held != groups_.end()
                                             ? held->second.task.reward_range
                                             : environment::RewardRange{};
  if (!range.Contains(reward)) {
    return absl::InvalidArgumentError(
        absl::StrCat("episode ", episode_id, ": reward must be a number in ",
                     range.ToString(), " (the task's range), got ", reward));
  }
  if (std::find(e.sources.begin(), e.sources.end(),
                engine::TokenSource::kModel) == e.sources.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "episode ", episode_id, " has no token of the model (", e.turns,
        " turns): nothing to train on (abort it to give the task back)"));
  }
  e.finished = true;
  e.reward = reward;
  Touched(e, now);
  const std::string lease_id = e.lease_id;
  Group& group = groups_.at(lease_id);
  for (const std::string& id : group.episode_ids) {
    if (!episodes_.at(id).finished) return absl::OkStatus();
  }
  std::vector<HarnessSample> samples;
  for (const std::string& id : group.episode_ids) {
    samples.push_back(ToSample(episodes_.at(id), group));
  }
  finished_groups_.push_back(std::move(samples));
  for (const std::string& id : group.episode_ids) {
    RememberEnded(id,
                  absl::StrCat("finished with reward ", episodes_.at(id).reward,
                               "; its group was submitted"));
    episodes_.erase(id);
  }
  groups_.erase(lease_id);
  return absl::OkStatus();
}

absl::Status HarnessEpisodes::Abort(const std::string& episode_id,
                                    const std::string& reason) {
  absl::MutexLock lock(&mu_);
  auto found = Find(episode_id);
  if (!found.ok()) return found.status();
  const std::string lease_id = (*found)->lease_id;
  const std::string why = absl::StrCat("aborted by its harness (episode ",
                                       episode_id, "): ", reason);
  DropGroup(lease_id, why);
  abandoned_.push_back(
      {.lease_id = lease_id, .why = HarnessReturn::kAborted, .reason = why});
  return absl::OkStatus();
}

void HarnessEpisodes::DropGroup(const std::string& lease_id,
                                const std::string& reason) {
  auto it = groups_.find(lease_id);
  if (it == groups_.end()) return;
  for (const std::string& id : it->second.episode_ids) {
    RememberEnded(
        id, absl::StrCat("its task went back to the coordinator: ", reason));
    episodes_.erase(id);
  }
  groups_.erase(it);
}

void HarnessEpisodes::RememberEnded(const std::string& episode_id,
                                    std::string reason) {
  if (ended_.emplace(episode_id, std::move(reason)).second) {
    ended_order_.push_back(episode_id);
  }
  while (ended_order_.size() > kRememberedEnds) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

HarnessSample HarnessEpisodes::ToSample(const Episode& e,
                                        const Group& g) const {
  HarnessSample out;
  out.reward = e.reward;
  engine::FinishedSample& s = out.sample;
  s.request_id = g.task.lease_id;
  s.sample_index = e.index;
  s.prompt = g.task.prompt;
  s.output.assign(
      e.context.begin() + static_cast<ptrdiff_t>(g.task.prompt.size()),
      e.context.end());
  s.logprobs = e.logprobs;
  for (size_t i = 0; i < e.versions.size(); ++i) {
    if (s.spans.empty() || s.spans.back().policy_version != e.versions[i]) {
      s.spans.push_back({.policy_version = e.versions[i], .num_tokens = 0});
    }
    ++s.spans.back().num_tokens;
  }
  for (const engine::TokenSource source : e.sources) {
    if (s.source_spans.empty() || s.source_spans.back().source != source) {
      s.source_spans.push_back({.source = source, .num_tokens = 0});
    }
    ++s.source_spans.back().num_tokens;
  }
  s.turns = e.turns;
  s.finish_reason = FinishReasonOf(e.last_finish);
  s.admitted = e.admitted;
  s.first_token = e.first_token;
  s.finished = e.last_activity;
  return out;
}

}  // namespace tandem::rollout
