#include "services/rollout/episode_driver.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/environment/episode_end_reason.h"
#include "common/environment/reward_range.h"

namespace tandem::rollout {
namespace {

auto Log() { return ComponentLogger("rollout"); }

}  // namespace

EpisodeDriver::EpisodeDriver(engine::Engine* engine, EnvironmentClient* client,
                             EpisodeCodec codec, chat::ToolCallFormat format,
                             EpisodeLimits limits)
    : engine_(engine),
      client_(client),
      codec_(std::move(codec)),
      format_(format),
      limits_(limits) {
  for (const std::string& stop : codec_.turn_stop_strings) {
    stop_window_ = std::max(stop_window_, stop.size() + 1);
  }
}

std::string EpisodeDriver::KeyText(const Key& key) {
  return absl::StrCat(key.first, "#", key.second);
}

std::optional<EpisodeDriver::Key> EpisodeDriver::ParseKey(
    const std::string& text) {
  const size_t hash = text.rfind('#');
  if (hash == std::string::npos) return std::nullopt;
  return Key{text.substr(0, hash), std::atoi(text.c_str() + hash + 1)};
}

absl::Status EpisodeDriver::Start(EpisodeTask task) {
  for (const auto& [key, e] : episodes_) {
    if (key.first == task.request_id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "episode request ", task.request_id, " is already running"));
    }
  }
  task.params.park_at_turn_end = true;
  task.params.report_tokens = !codec_.turn_stop_strings.empty();
  task.params.max_tokens =
      std::min(task.params.max_tokens, limits_.max_turn_tokens);
  const std::vector<int32_t>& header = codec_.generation_header;
  const bool await_opens =
      codec_.render_opening && !header.empty() &&
      (task.prompt.size() < header.size() ||
       !std::equal(
           header.begin(), header.end(),
           task.prompt.end() - static_cast<std::ptrdiff_t>(header.size())));
  if (await_opens) {
    // Engine::Add's checks, now rather than when the opens answer.
    absl::Status fits = engine_->CheckAdd(
        task.request_id, static_cast<int64_t>(task.prompt.size()), task.params);
    if (!fits.ok()) return fits;
    Unstarted& u = unstarted_[task.request_id];
    u.prompt = std::move(task.prompt);
    u.params = task.params;
    u.waiting = task.params.n;
  } else {
    absl::Status added =
        engine_->Add(task.request_id, std::move(task.prompt), task.params);
    if (!added.ok()) return added;
  }
  for (int32_t i = 0; i < task.params.n; ++i) {
    const Key key{task.request_id, i};
    Episode& e = episodes_[key];
    e.request_id = task.request_id;
    e.reward_range = task.reward_range;
    e.sample_index = i;
    e.awaiting_start = await_opens;
    client_->Open(KeyText(key), task.open);
  }
  return absl::OkStatus();
}

std::vector<std::string> EpisodeDriver::AbortUnstarted() {
  std::vector<std::string> ids;
  for (auto& [request_id, u] : unstarted_) {
    for (int32_t i = 0; i < u.params.n; ++i) {
      auto it = episodes_.find({request_id, i});
      if (it == episodes_.end()) continue;
      const std::string key = KeyText(it->first);
      if (!it->second.episode_id.empty()) {
        client_->Close(key, it->second.episode_id);
      } else if (!it->second.open_answered) {
        orphaned_opens_.insert(key);  // closed when its open answers
      }
      episodes_.erase(it);
    }
    ids.push_back(request_id);
  }
  unstarted_.clear();
  return ids;
}

void EpisodeDriver::HandleOpening(Episode& e, const EnvironmentReply& reply) {
  e.open_answered = true;
  if (!reply.status.ok()) {
    e.early_end_reason = "environment_failed";
    e.early_end_text = std::string(reply.status.message());
  } else {
    e.episode_id = reply.open.episode_id();
    std::vector<tandem::v1::Observation> observations(
        reply.open.observations().begin(), reply.open.observations().end());
    absl::StatusOr<std::vector<int32_t>> tokens =
        codec_.render_opening(observations);
    if (!tokens.ok()) {
      e.early_end_reason = "environment_failed";
      e.early_end_text =
          absl::StrCat("cannot render the opening observations: ",
                       tokens.status().message());
    } else if (static_cast<int64_t>(tokens->size()) >=
               limits_.max_episode_tokens) {
      // Not one token of the model's would fit after them.
      e.early_end_reason = "observation_too_large";
      e.early_end_text = absl::StrCat(
          "the environment opened the episode with ", observations.size(),
          " observations of ", tokens->size(),
          " tokens (with the generation header), which leave no room in "
          "max_episode_tokens ",
          limits_.max_episode_tokens);
    } else {
      e.opening = std::move(*tokens);
    }
  }
  auto u = unstarted_.find(e.request_id);
  if (u != unstarted_.end() && --u->second.waiting == 0) {
    StartOpened(e.request_id);
  }
}

void EpisodeDriver::StartOpened(const std::string& request_id) {
  auto node = unstarted_.extract(request_id);
  if (node.empty()) return;
  Unstarted& u = node.mapped();
  const int32_t n = u.params.n;
  std::vector<std::vector<int32_t>> opening(n);
  // One first-turn budget for the group: what the longest opening leaves.
  int32_t room = limits_.max_episode_tokens;
  for (int32_t i = 0; i < n; ++i) {
    Episode& e = episodes_.at({request_id, i});
    if (!e.early_end_reason.empty()) {
      // It ends at its first park; the header keeps that turn in form.
      opening[i] = codec_.generation_header;
      continue;
    }
    opening[i] = std::move(e.opening);
    e.opening.clear();
    room = std::min(room, limits_.max_episode_tokens -
                              static_cast<int32_t>(opening[i].size()));
  }
  engine::SamplingParams params = u.params;
  params.max_tokens = std::max(1, std::min(params.max_tokens, room));
  absl::Status added = engine_->Add(request_id, u.prompt, params, opening);
  if (!added.ok()) {
    // The openings do not fit in the KV cache: the samples are added
    // without them and end at their first park.
    for (int32_t i = 0; i < n; ++i) {
      Episode& e = episodes_.at({request_id, i});
      if (!e.early_end_reason.empty()) continue;
      e.early_end_reason = "token_limit";
      e.early_end_text = std::string(added.message());
    }
    absl::Status bare = engine_->Add(request_id, u.prompt, params);
    if (!bare.ok()) {
      // Start checked that the prompt fits (Engine::CheckAdd): not
      // expected. The samples end "aborted", so that the lease goes back.
      Log()->error("episode request {}: {}", request_id,
                   std::string(bare.message()));
      for (int32_t i = 0; i < n; ++i) {
        Episode& e = episodes_.at({request_id, i});
        if (!e.episode_id.empty()) {
          client_->Close(KeyText({request_id, i}), e.episode_id);
        }
        EpisodeResult result = std::move(e.result);
        result.end_reason = "aborted";
        result.end_text = std::string(bare.message());
        result.sample.request_id = request_id;
        result.sample.sample_index = i;
        result.sample.prompt = u.prompt;
        result.sample.finish_reason = engine::FinishReason::kAborted;
        finished_.push_back(std::move(result));
        episodes_.erase({request_id, i});
      }
      return;
    }
  }
  for (int32_t i = 0; i < n; ++i) {
    Episode& e = episodes_.at({request_id, i});
    e.awaiting_start = false;
    if (e.early_end_reason.empty()) continue;
    // Ends at its first turn's park, as an episode whose open failed always
    // has: a completion is never empty (the trainer needs a token of it).
    e.open_failed = true;
    e.result.end_text = e.early_end_text;
  }
}

void EpisodeDriver::Poll() {
  for (engine::ParkedTurn& turn : engine_->TakeParked()) {
    auto it = episodes_.find({turn.request_id, turn.sample_index});
    if (it == episodes_.end()) continue;  // not an episode of this driver
    HandleTurn(it->second, std::move(turn));
  }
  for (EnvironmentReply& reply : client_->TakeCompleted()) {
    HandleReply(std::move(reply));
  }
}

void EpisodeDriver::OnTokens(const std::vector<engine::TokenEvent>& events) {
  if (codec_.turn_stop_strings.empty()) return;
  for (const engine::TokenEvent& event : events) {
    auto it = episodes_.find({event.request_id, event.sample_index});
    if (it == episodes_.end()) continue;
    Episode& e = it->second;
    if (e.ended || e.turn_stopped) continue;
    e.turn_tokens.push_back(event.token);
    const size_t window = std::min(stop_window_, e.turn_tokens.size());
    const std::string tail = codec_.decode_turn(std::vector<int32_t>(
        e.turn_tokens.end() - static_cast<std::ptrdiff_t>(window),
        e.turn_tokens.end()));
    const bool stop = std::any_of(
        codec_.turn_stop_strings.begin(), codec_.turn_stop_strings.end(),
        [&tail](const std::string& s) {
          return tail.find(s) != std::string::npos;
        });
    if (!stop) continue;
    // The turn may have ended in this step anyway (a stop token, its
    // budget): then it is parked already and this is refused; no matter.
    e.turn_stopped = engine_->EndTurn(e.request_id, e.sample_index).ok();
  }
}

void EpisodeDriver::HandleTurn(Episode& e, engine::ParkedTurn turn) {
  e.turn_tokens.clear();
  e.turn_open = e.turn_stopped;
  e.turn_stopped = false;
  e.completion_tokens =
      turn.turn_start + static_cast<int32_t>(turn.turn_tokens.size());
  e.turns = turn.turn;
  if (e.open_failed) {
    End(e,
        e.early_end_reason.empty() ? "environment_failed" : e.early_end_reason,
        e.result.end_text);
    return;
  }
  if (e.episode_id.empty()) {
    e.pending_turn = std::move(turn);  // sent when the episode is open
    return;
  }
  SendTurn(e, turn);
}

void EpisodeDriver::SendTurn(Episode& e, const engine::ParkedTurn& turn) {
  const std::string text = codec_.decode_turn(turn.turn_tokens);
  tandem::v1::StepRequest step;
  step.set_episode_id(e.episode_id);
  absl::StatusOr<chat::ParsedTurn> parsed = chat::ParseToolCalls(
      text, format_, absl::StrCat("call_", turn.turn, "_"));
  if (parsed.ok()) {
    step.mutable_action()->set_text(parsed->content);
    for (const chat::ParsedToolCall& call : parsed->calls) {
      tandem::v1::ToolCall* out = step.mutable_action()->add_tool_calls();
      out->set_id(call.id);
      out->set_name(call.name);
      out->set_arguments_json(call.arguments_json);
    }
    e.result.tool_calls += static_cast<int32_t>(parsed->calls.size());
  } else {
    // The model gets an observation about its malformed call, not a crash.
    ++e.result.malformed_turns;
    step.mutable_action()->set_text(
        absl::StrCat("malformed tool call: ", parsed.status().message()));
  }
  e.step_in_flight = true;
  client_->Step(KeyText({e.request_id, e.sample_index}), std::move(step));
}

void EpisodeDriver::HandleReply(EnvironmentReply reply) {
  if (reply.kind == EnvironmentReply::Kind::kClose) {
    if (!reply.status.ok()) {
      Log()->warn("{}", std::string(reply.status.message()));
    }
    return;
  }
  std::optional<Key> key = ParseKey(reply.key);
  if (!key) return;
  auto it = episodes_.find(*key);
  if (it == episodes_.end()) {
    // An episode that opened after its sample was aborted: close it.
    if (reply.kind == EnvironmentReply::Kind::kOpen &&
        orphaned_opens_.erase(reply.key) > 0 && reply.status.ok()) {
      client_->Close(reply.key, reply.open.episode_id());
    }
    return;
  }
  Episode& e = it->second;
  if (e.ended) return;
  if (reply.kind == EnvironmentReply::Kind::kOpen && e.awaiting_start) {
    HandleOpening(e, reply);
    return;
  }
  if (reply.kind == EnvironmentReply::Kind::kOpen) {
    if (!reply.status.ok()) {
      e.open_failed = true;
      e.result.end_text = std::string(reply.status.message());
      if (e.pending_turn) End(e, "environment_failed", e.result.end_text);
      return;
    }
    e.episode_id = reply.open.episode_id();
    if (reply.open.observations_size() > 0) {
      // The prompt ends with the generation header, so the model has
      // already begun to answer it: refused, not dropped (the model would
      // act without them and be trained on that).
      e.open_failed = true;
      e.result.end_text = absl::StrCat(
          "the environment opened the episode with ",
          reply.open.observations_size(),
          " observations before the first turn, but the task's prompt ends "
          "with the generation header, so the model answers it at once; "
          "write the prompts of this environment without the generation "
          "header (docs/environments.md, \"Opening observations\")");
      client_->Close(reply.key, e.episode_id);
      e.episode_id.clear();
      if (e.pending_turn) End(e, "environment_failed", e.result.end_text);
      return;
    }
    if (e.pending_turn) {
      engine::ParkedTurn turn = std::move(*e.pending_turn);
      e.pending_turn.reset();
      SendTurn(e, turn);
    }
    return;
  }
  // A Step reply: the sequence is parked.
  e.step_in_flight = false;
  if (!reply.status.ok()) {
    End(e, "environment_failed", std::string(reply.status.message()));
    return;
  }
  const tandem::v1::StepResponse& step = reply.step;
  if (step.done()) {
    if (step.has_reward()) {
      const double reward = step.reward();
      // Delivered as it came, the coordinator would refuse the sample and
      // its lease could never complete.
      if (!e.reward_range.Contains(reward)) {
        End(e, "error",
            absl::StrCat("the environment's reward ", reward,
                         " is not finite or outside the task's range ",
                         e.reward_range.ToString(), "; dropped (",
                         step.end_text(), ")"));
        return;
      }
      e.result.reward = reward;
    }
    // Done without a reason: the environment's own end (a bounded label the
    // coordinator accepts).
    End(e, std::string(environment::EndReasonLabel(step.end_reason(),
                                                   "environment")),
        step.end_text());
    return;
  }
  std::vector<tandem::v1::Observation> observations(step.observations().begin(),
                                                    step.observations().end());
  absl::StatusOr<std::vector<int32_t>> tokens =
      codec_.render_observations(observations);
  if (!tokens.ok()) {
    End(e, "environment_failed",
        absl::StrCat("cannot render the observations: ",
                     tokens.status().message()));
    return;
  }
  if (e.turn_open) {
    tokens->insert(tokens->begin(), codec_.turn_end_tokens.begin(),
                   codec_.turn_end_tokens.end());
  }
  if (e.turns >= limits_.max_turns) {
    End(e, "turn_limit",
        absl::StrCat("the model took ", e.turns, " turns (max_turns ",
                     limits_.max_turns, ") without the environment ending"));
    return;
  }
  const int32_t room = limits_.max_episode_tokens - e.completion_tokens -
                       static_cast<int32_t>(tokens->size());
  if (room < 1) {
    End(e, "token_limit",
        absl::StrCat(e.completion_tokens, " completion tokens + ",
                     tokens->size(),
                     " observation tokens leave no room in "
                     "max_episode_tokens ",
                     limits_.max_episode_tokens));
    return;
  }
  absl::Status resumed =
      engine_->Resume(e.request_id, e.sample_index, *tokens,
                      std::min(room, limits_.max_turn_tokens));
  if (!resumed.ok()) {
    End(e, "token_limit", std::string(resumed.message()));
  }
}

void EpisodeDriver::End(Episode& e, std::string reason, std::string text) {
  e.ended = true;
  e.result.end_reason = std::move(reason);
  e.result.end_text = std::move(text);
  if (!e.episode_id.empty()) {
    client_->Close(KeyText({e.request_id, e.sample_index}), e.episode_id);
  }
  absl::Status ended = engine_->EndEpisode(e.request_id, e.sample_index);
  if (!ended.ok()) {
    Log()->warn("episode {}#{}: {}", e.request_id, e.sample_index,
                std::string(ended.message()));
  }
}

bool EpisodeDriver::OnFinished(engine::FinishedSample& sample) {
  auto it = episodes_.find({sample.request_id, sample.sample_index});
  if (it == episodes_.end()) return false;
  Episode& e = it->second;
  EpisodeResult result = std::move(e.result);
  if (!e.ended) {
    // Aborted by the engine (shutdown, engine error) or never parked.
    result.end_reason = "aborted";
    if (!e.episode_id.empty()) {
      client_->Close(KeyText(it->first), e.episode_id);
    } else if (!e.open_failed) {
      orphaned_opens_.insert(KeyText(it->first));  // its open is in flight
    }
  }
  result.sample = std::move(sample);
  finished_.push_back(std::move(result));
  episodes_.erase(it);
  return true;
}

std::vector<EpisodeResult> EpisodeDriver::TakeFinished() {
  std::vector<EpisodeResult> out;
  out.swap(finished_);
  return out;
}

}  // namespace tandem::rollout
