#include "services/verifier/environment/episode_table.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/environment/episode_end_reason.h"

namespace tandem::verifier {

using tandem::v1::EpisodeEndReason;

namespace {

// The metric label of an end reason; "error" for an unset or unknown one.
absl::string_view EndLabel(EpisodeEndReason reason) {
  return environment::EndReasonLabel(reason, "error");
}

// OK when `caller` opened `episode`; PermissionDenied naming both.
absl::Status CheckOwnerOf(const std::string& owner, const std::string& id,
                          const std::string& caller) {
  if (owner == caller) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "episode '", id.substr(0, 64), "' was opened by ",
      owner.empty() ? "an unidentified caller" : owner, ", not by ",
      caller.empty() ? "an unidentified caller" : caller,
      "; only its opener may step or close it"));
}

}  // namespace

EpisodeTable::EpisodeTable(
    const EnvironmentConfig& config,
    const std::map<std::string, std::unique_ptr<Scorer>>* scorers,
    EnvironmentMetrics* metrics, absl::Duration score_timeout, Clock* clock)
    : config_(config),
      score_timeout_(score_timeout),
      clock_(clock),
      scorers_(scorers),
      metrics_(metrics),
      random_(std::random_device{}()) {
  for (auto make : {MakeCalculatorEnvironment, MakeSingleTurnEnvironment}) {
    std::unique_ptr<BuiltinEnvironment> env = make();
    const std::string name = env->name();
    environments_[name] = std::move(env);
  }
}

std::vector<tandem::v1::EnvironmentInfo> EpisodeTable::List() const {
  std::vector<tandem::v1::EnvironmentInfo> out;
  for (const auto& [name, env] : environments_) {
    tandem::v1::EnvironmentInfo& info = out.emplace_back();
    info.set_name(name);
    info.set_description(env->description());
    info.set_tools_json(env->tools_json());
  }
  return out;
}

absl::StatusOr<tandem::v1::OpenEpisodeResponse> EpisodeTable::Open(
    const tandem::v1::OpenEpisodeRequest& request, const std::string& owner) {
  if (cancelled_.load()) {
    return absl::UnavailableError("the verifier is shutting down");
  }
  auto env = environments_.find(request.environment());
  if (env == environments_.end()) {
    std::vector<std::string> known;
    for (const auto& [name, e] : environments_) known.push_back(name);
    return absl::InvalidArgumentError(
        absl::StrCat("environment: unknown environment '",
                     request.environment().substr(0, 64),
                     "' (known: ", absl::StrJoin(known, ", "), ")"));
  }
  auto scorer = scorers_->find(request.verifier());
  if (scorer == scorers_->end()) {
    std::vector<std::string> known;
    for (const auto& [name, s] : *scorers_) known.push_back(name);
    return absl::InvalidArgumentError(absl::StrCat(
        "verifier: unknown verifier '", request.verifier().substr(0, 64),
        "' (known: ", absl::StrJoin(known, ", "), ")"));
  }
  auto episode = std::make_shared<Episode>();
  episode->environment = env->second.get();
  episode->owner = owner;
  episode->task.task_id = request.task_id();
  episode->task.prompt_text = request.prompt_text();
  episode->task.scorer = scorer->second.get();
  episode->task.metadata.insert(request.metadata().begin(),
                                request.metadata().end());
  episode->task.score_timeout = score_timeout_;
  episode->task.cancelled = &cancelled_;
  {
    ScoreRequest check;
    check.prompt_text = request.prompt_text();
    check.metadata = episode->task.metadata;
    absl::Status status = scorer->second->Validate(check);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("task (", request.verifier(), "): ", status.message()));
    }
  }
  const absl::Duration limit = absl::Milliseconds(config_.episode_timeout_ms);
  const absl::Time now = clock_->Now();
  episode->last_call = now;
  episode->deadline = now + limit;
  episode->task.deadline = absl::Now() + limit;
  tandem::v1::OpenEpisodeResponse response;
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int64_t>(episodes_.size()) >= config_.max_open_episodes) {
      metrics_->CountRefused();
      return absl::ResourceExhaustedError(
          absl::StrCat(episodes_.size(),
                       " episodes are held, environment.max_open_episodes "
                       "is ",
                       config_.max_open_episodes,
                       "; close finished episodes or retry later"));
    }
    std::string id;
    do {
      id = absl::StrFormat("%016x%016x", random_(), random_());
    } while (episodes_.count(id) > 0);
    episodes_[id] = episode;
    UpdateGauge();
    response.set_episode_id(id);
  }
  metrics_->CountOpened(request.environment());
  response.set_tools_json(env->second->tools_json());
  response.set_max_turns(static_cast<uint32_t>(config_.max_turns));
  response.set_deadline_unix_ms(absl::ToUnixMillis(episode->task.deadline));
  return response;
}

absl::StatusOr<tandem::v1::StepResponse> EpisodeTable::Step(
    const tandem::v1::StepRequest& request, const std::string& caller) {
  const tandem::v1::Action& action = request.action();
  std::shared_ptr<Episode> episode;
  tandem::v1::StepResponse response;
  {
    absl::MutexLock lock(&mu_);
    auto it = episodes_.find(request.episode_id());
    if (it == episodes_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "episode '", request.episode_id().substr(0, 64),
          "' is not open here (never opened, closed, or reaped after "
          "environment.idle_timeout_ms of ",
          config_.idle_timeout_ms, " ms)"));
    }
    if (absl::Status owned = CheckOwnerOf(it->second->owner, it->first, caller);
        !owned.ok()) {
      return owned;
    }
    episode = it->second;
    episode->last_call = clock_->Now();
    if (episode->ended != tandem::v1::EPISODE_END_REASON_UNSPECIFIED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the episode has ended (", EndLabel(episode->ended), ": ",
          episode->end_text, "); close it"));
    }
    if (episode->busy) {
      return absl::FailedPreconditionError(
          "another Step of this episode is running; steps are sequential");
    }
    if (static_cast<int64_t>(action.ByteSizeLong()) >
        config_.max_action_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("action of ", action.ByteSizeLong(),
                       " bytes is over environment.max_action_bytes (",
                       config_.max_action_bytes, ")"));
    }
    if (action.tool_calls_size() > config_.max_tool_calls) {
      return absl::InvalidArgumentError(
          absl::StrCat("action.tool_calls: ", action.tool_calls_size(),
                       " calls are over environment.max_tool_calls (",
                       config_.max_tool_calls, ")"));
    }
    response.set_turn(++episode->turns);
    if (clock_->Now() >= episode->deadline) {
      End(*episode, tandem::v1::EPISODE_END_TIMEOUT,
          absl::StrCat("environment.episode_timeout_ms of ",
                       config_.episode_timeout_ms, " ms passed"));
      response.set_done(true);
      response.set_end_reason(episode->ended);
      response.set_end_text(episode->end_text);
      return response;
    }
    episode->busy = true;
  }
  StepResult result =
      episode->environment->Step(episode->task, action, *metrics_);
  absl::MutexLock lock(&mu_);
  episode->busy = false;
  episode->last_call = clock_->Now();
  size_t bytes = 0;
  for (const tandem::v1::Observation& obs : result.observations) {
    bytes += obs.content().size();
  }
  if (!result.done && clock_->Now() >= episode->deadline) {
    result = StepResult{};
    result.done = true;
    result.end_reason = tandem::v1::EPISODE_END_TIMEOUT;
    result.end_text = absl::StrCat("environment.episode_timeout_ms of ",
                                   config_.episode_timeout_ms, " ms passed");
  } else if (static_cast<int64_t>(bytes) > config_.max_observation_bytes) {
    result = StepResult{};
    result.done = true;
    result.end_reason = tandem::v1::EPISODE_END_OBSERVATION_TOO_LARGE;
    result.end_text =
        absl::StrCat("the step's observations are ", bytes,
                     " bytes, over environment.max_observation_bytes (",
                     config_.max_observation_bytes, ")");
  } else if (!result.done && episode->turns >= config_.max_turns) {
    // The observations of this turn are kept: the worker may log them, but
    // the model gets no further turn.
    result.done = true;
    result.end_reason = tandem::v1::EPISODE_END_MAX_TURNS;
    result.end_text = absl::StrCat("environment.max_turns (", config_.max_turns,
                                   ") turns taken without an answer");
  }
  if (result.done) End(*episode, result.end_reason, result.end_text);
  for (tandem::v1::Observation& obs : result.observations) {
    *response.add_observations() = std::move(obs);
  }
  response.set_done(result.done);
  if (result.reward.has_value()) response.set_reward(*result.reward);
  response.set_end_reason(result.end_reason);
  response.set_end_text(result.end_text);
  response.set_outcome(result.outcome);
  return response;
}

absl::StatusOr<bool> EpisodeTable::Close(const std::string& episode_id,
                                          const std::string& caller) {
  absl::MutexLock lock(&mu_);
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end()) return false;
  if (absl::Status owned = CheckOwnerOf(it->second->owner, episode_id, caller);
      !owned.ok()) {
    return owned;
  }
  if (it->second->ended == tandem::v1::EPISODE_END_REASON_UNSPECIFIED) {
    metrics_->CountEnded(kEndReasonClosed);
  }
  episodes_.erase(it);
  UpdateGauge();
  return true;
}

int EpisodeTable::Reap(absl::Time now) {
  const absl::Duration idle = absl::Milliseconds(config_.idle_timeout_ms);
  absl::MutexLock lock(&mu_);
  int reaped = 0;
  for (auto it = episodes_.begin(); it != episodes_.end();) {
    Episode& episode = *it->second;
    if (!episode.busy && now - episode.last_call >= idle) {
      if (episode.ended == tandem::v1::EPISODE_END_REASON_UNSPECIFIED) {
        metrics_->CountEnded(kEndReasonIdle);
      }
      it = episodes_.erase(it);
      ++reaped;
    } else {
      ++it;
    }
  }
  if (reaped > 0) UpdateGauge();
  return reaped;
}

size_t EpisodeTable::size() const {
  absl::MutexLock lock(&mu_);
  return episodes_.size();
}

void EpisodeTable::End(Episode& episode, EpisodeEndReason reason,
                       std::string text) {
  episode.ended = reason;
  episode.end_text = std::move(text);
  metrics_->CountEnded(EndLabel(reason));
}

void EpisodeTable::UpdateGauge() {
  metrics_->open().Set(static_cast<double>(episodes_.size()));
}

}  // namespace tandem::verifier
