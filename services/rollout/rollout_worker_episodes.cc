// RolloutWorker's multi-turn episodes (docs/environments.md, "Episodes in
// the rollout worker"): a lease that names an environment runs its
// group_size samples as episodes through EpisodeDriver, against the
// tandem.v1.Environment service at environment.address; the driver is
// polled after every engine step, and a finished episode is delivered with
// its source spans, the environment's reward and its end reason. Kept
// apart from rollout_worker.cc, which is about single-turn leases.

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/chat/episode_render.h"
#include "common/rpc/grpc_client.h"
#include "services/rollout/rollout_worker.h"

namespace tandem::rollout {
namespace {

// The chat messages of an environment's observations.
nlohmann::ordered_json ObservationMessages(
    const std::vector<tandem::v1::Observation>& observations) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (const tandem::v1::Observation& o : observations) {
    nlohmann::ordered_json m = {{"role", o.role()}, {"content", o.content()}};
    if (!o.tool_call_id().empty()) m["tool_call_id"] = o.tool_call_id();
    if (!o.name().empty()) m["name"] = o.name();
    messages.push_back(std::move(m));
  }
  return messages;
}

auto Log() { return ComponentLogger("rollout"); }

}  // namespace

absl::Status RolloutWorker::StartEpisodes() {
  if (config_.environment_address.empty()) return absl::OkStatus();
  if (config_.model_path.empty()) {
    return absl::FailedPreconditionError(
        "environment.address is set but the built-in arithmetic model has "
        "no chat template to render observations with; use a model.path "
        "whose tokenizer_config.json has one");
  }
  ASSIGN_OR_RETURN(chat::LoadedChatTemplates loaded,
                   chat::LoadChatTemplates(config_.model_path));
  if (absl::Status usable = loaded.Get().status(); !usable.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "environment.address is set but model.path '", config_.model_path,
        "' has no usable chat template: ", usable.message()));
  }
  ASSIGN_OR_RETURN(
      chat::ToolCallFormat format,
      chat::ToolCallFormatFromName(config_.environment_tool_call_format));
  episode_templates_ =
      std::make_shared<const chat::LoadedChatTemplates>(std::move(loaded));

  EnvironmentClientOptions options;
  options.open_timeout =
      absl::Milliseconds(config_.environment_open_timeout_ms);
  options.step_timeout =
      absl::Milliseconds(config_.environment_step_timeout_ms);
  options.close_timeout =
      absl::Milliseconds(config_.environment_close_timeout_ms);
  environment_ = std::make_unique<EnvironmentClient>(
      rpc::MakeChannel(config_.environment_address, config_.server.tls),
      config_.environment_address, options);

  EpisodeCodec codec;
  const tokenizer::Tokenizer* tokenizer = model_.tokenizer.get();
  codec.decode_turn = [tokenizer](const std::vector<int32_t>& tokens) {
    return tokenizer->Decode(tokens, /*skip_special=*/false);
  };
  codec.turn_stop_strings = config_.environment_turn_stop_strings;
  if (!codec.turn_stop_strings.empty()) {
    codec.turn_end_tokens = tokenizer->Encode(config_.environment_turn_end);
  }
  std::shared_ptr<const chat::LoadedChatTemplates> templates =
      episode_templates_;
  const std::string turn_end = config_.environment_turn_end;
  codec.render_observations =
      [templates, tokenizer,
       turn_end](const std::vector<tandem::v1::Observation>& observations)
      -> absl::StatusOr<std::vector<int32_t>> {
    const nlohmann::ordered_json messages = ObservationMessages(observations);
    ASSIGN_OR_RETURN(const chat::ChatTemplate* tmpl, templates->Get());
    ASSIGN_OR_RETURN(std::string text, chat::RenderContinuation(
                                           *tmpl, messages, turn_end, nullptr,
                                           nlohmann::ordered_json::object(),
                                           templates->special_tokens));
    return tokenizer->Encode(text);
  };
  // Opening observations follow a prompt written without the generation
  // header (docs/environments.md, "Opening observations").
  codec.render_opening =
      [templates,
       tokenizer](const std::vector<tandem::v1::Observation>& observations)
      -> absl::StatusOr<std::vector<int32_t>> {
    const nlohmann::ordered_json messages = ObservationMessages(observations);
    ASSIGN_OR_RETURN(const chat::ChatTemplate* tmpl, templates->Get());
    ASSIGN_OR_RETURN(std::string text,
                     chat::RenderOpening(*tmpl, messages, nullptr,
                                         nlohmann::ordered_json::object(),
                                         templates->special_tokens));
    return tokenizer->Encode(text);
  };
  absl::StatusOr<std::vector<int32_t>> header = codec.render_opening({});
  if (header.ok() && !header->empty()) {
    codec.generation_header = std::move(*header);
  } else {
    // Without a header no prompt can be told apart: opening observations
    // are refused, as before.
    Log()->warn(
        "episodes: the chat template gives no generation header ({}); "
        "opening observations will be refused",
        header.ok() ? "empty" : std::string(header.status().message()));
    codec.render_opening = nullptr;
  }
  const size_t header_tokens = codec.generation_header.size();
  EpisodeLimits limits;
  limits.max_turns = static_cast<int32_t>(config_.environment_max_turns);
  limits.max_turn_tokens =
      static_cast<int32_t>(config_.environment_max_turn_tokens);
  limits.max_episode_tokens =
      static_cast<int32_t>(config_.environment_max_episode_tokens);
  episodes_ = std::make_unique<EpisodeDriver>(engine_.get(), environment_.get(),
                                              std::move(codec), format, limits);
  Log()->info(
      "episodes: environment service at {}, tool calls {}, max_turns {}, "
      "max_turn_tokens {}, max_episode_tokens {}; prompts without the "
      "generation header ({} tokens) wait for their opening observations",
      config_.environment_address, chat::ToolCallFormatName(format),
      limits.max_turns, limits.max_turn_tokens, limits.max_episode_tokens,
      header_tokens);
  return absl::OkStatus();
}

absl::Status RolloutWorker::StartEpisodeLease(
    const tandem::v1::PromptLease& lease, engine::SamplingParams params) {
  if (harness_ && lease.environment() == config_.openai_harness_environment) {
    return OfferHarnessLease(lease, params);
  }
  if (!episodes_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lease ", lease.lease_id(), " names environment '", lease.environment(),
        "' but this worker has no environment.address; returned for a "
        "worker that runs episodes"));
  }
  EpisodeTask task;
  task.request_id = lease.lease_id();
  task.prompt.assign(lease.prompt_token_ids().begin(),
                     lease.prompt_token_ids().end());
  // The episode may use what the context leaves (the driver caps each
  // turn at environment.max_turn_tokens).
  task.params = std::move(params);
  task.open.set_environment(lease.environment());
  task.open.set_task_id(lease.prompt_id());
  task.open.set_prompt_text(lease.prompt_text());
  task.open.set_verifier(lease.verifier());
  for (const auto& [key, value] : lease.metadata()) {
    (*task.open.mutable_metadata())[key] = value;
  }
  if (lease.has_reward_range()) {
    task.reward_range = {lease.reward_range().min(), lease.reward_range().max()};
  }
  return episodes_->Start(std::move(task));
}

void RolloutWorker::PollAndDeliver() {
  if (harness_) DeliverHarness();
  if (episodes_) episodes_->Poll();
  for (engine::FinishedSample& f : engine_->TakeFinished()) {
    if (episodes_ && episodes_->OnFinished(f)) continue;
    if (!serving_.Dispatch(f)) Deliver(std::move(f));
  }
  if (!episodes_) return;
  for (EpisodeResult& result : episodes_->TakeFinished()) {
    DeliverEpisode(std::move(result));
  }
}

void RolloutWorker::DeliverEpisode(EpisodeResult result) {
  metrics_.RecordEpisode(result.end_reason, result.tool_calls,
                         result.malformed_turns);
  if (result.end_reason != "aborted") {
    engine::FinishedSample sample = std::move(result.sample);
    Deliver(std::move(sample), &result);
    return;
  }
  // Aborted by the engine: if its lease is still held (not by AbortAllWork,
  // which returns them), the group cannot complete here; give it back.
  metrics_.RecordFinished(result.sample);
  auto it = leases_.find(result.sample.request_id);
  if (it == leases_.end()) return;
  engine_->Abort(it->first);
  prefetcher_->Return({it->first}, "episode aborted");
  leases_.erase(it);
}

absl::Status RolloutWorker::OfferHarnessLease(
    const tandem::v1::PromptLease& lease,
    const engine::SamplingParams& params) {
  HarnessTask task;
  task.lease_id = lease.lease_id();
  task.group_id = lease.group_id();
  task.task_id = lease.prompt_id();
  task.prompt_text = lease.prompt_text();
  task.prompt.assign(lease.prompt_token_ids().begin(),
                     lease.prompt_token_ids().end());
  task.group_size = params.n;
  task.temperature = params.temperature;
  task.max_tokens = lease.sampling().max_tokens();
  task.verifier = lease.verifier();
  for (const auto& [key, value] : lease.metadata()) task.metadata[key] = value;
  if (lease.has_reward_range()) {
    task.reward_range = {lease.reward_range().min(), lease.reward_range().max()};
  }
  return harness_->Offer(std::move(task), harness_->Now());
}

void RolloutWorker::DeliverHarness() {
  for (std::vector<HarnessSample>& group : harness_->TakeFinishedGroups()) {
    for (HarnessSample& s : group) {
      EpisodeResult result;
      result.reward = s.reward;
      // The harness is the environment: its reward is the score.
      result.end_reason = "environment";
      result.end_text = "finished by its harness";
      metrics_.RecordEpisode(result.end_reason, 0, 0);
      Deliver(std::move(s.sample), &result);
    }
  }
  for (HarnessAbandoned& a : harness_->TakeAbandoned(harness_->Now())) {
    Log()->warn("harness episodes of lease {} given back: {}", a.lease_id,
                a.reason);
    metrics_.harness_leases_returned
        .Add({{"reason", HarnessReturnLabel(a.why)}})
        .Increment();
    auto it = leases_.find(a.lease_id);
    if (it == leases_.end()) continue;
    prefetcher_->Return({a.lease_id}, a.reason.substr(0, 1024));
    leases_.erase(it);
  }
  metrics_.RecordHarness(harness_->TakeCounts());
}

}  // namespace tandem::rollout
