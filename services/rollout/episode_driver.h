#pragma once

// EpisodeDriver runs multi-turn episodes on the engine thread: for each
// sample of an episode task it opens an episode on an Environment service,
// lets the engine generate a turn (the sequence parks with its KV cache),
// parses the turn's tool calls, sends them with EnvironmentClient (never
// blocking), and resumes the sequence with the rendered observations until
// the environment says done or a limit ends the episode. Other sequences
// keep the batch while an episode waits. A task whose prompt is written
// without the chat template's generation header waits for its opens and
// starts each sample after its own opening observations and the header,
// as environment tokens (docs/environments.md, "Opening observations").
//
// The caller (the rollout worker's generation loop, or a test) calls
// Poll() after every Engine::Step(), and hands every FinishedSample whose
// request is an episode to OnFinished(), which returns the episode with
// its reward and end reason through TakeFinished().
//
// Not thread-safe: the engine thread owns it, as it owns the Engine.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/tool_calls.h"
#include "common/environment/reward_range.h"
#include "engine/engine.h"
#include "services/rollout/environment_client.h"

namespace tandem::rollout {

struct EpisodeLimits {
  // Model turns per episode; the turn after the last one is not sent.
  int32_t max_turns = 8;
  // Generated tokens per model turn (the engine's per-turn budget).
  int32_t max_turn_tokens = 256;
  // Completion tokens per episode, the model's and the environment's.
  int32_t max_episode_tokens = 4096;
};

// Text in and out of the model's token space.
struct EpisodeCodec {
  // A model turn's tokens to text, special tokens kept (the tool-call
  // parser needs them).
  std::function<std::string(const std::vector<int32_t>&)> decode_turn;
  // The tokens to append after a model turn for these observations (the
  // chat template's rendering of the tool/user messages and of the next
  // assistant header).
  std::function<absl::StatusOr<std::vector<int32_t>>(
      const std::vector<tandem::v1::Observation>&)>
      render_observations;
  // Texts that end a model turn as soon as its decoded text contains one
  // (e.g. "</tool_call>"), besides stop tokens and EOS; the turn keeps the
  // tokens that wrote it. Empty: none (the engine then reports no tokens).
  std::vector<std::string> turn_stop_strings;
  // The end-of-turn tokens the chat template writes after a model turn
  // (<|im_end|>): a turn a stop string ended has not written them, so they
  // come first in the environment's tokens after it (render_observations
  // renders what follows them).
  std::vector<int32_t> turn_end_tokens;
  // Opening observations (OpenEpisodeResponse.observations): the tokens
  // that follow a prompt written without the generation header, i.e. the
  // chat template's rendering of the observations and of the assistant
  // header (the header alone for none). Unset: episodes never take
  // opening observations (each is refused, environment_failed).
  std::function<absl::StatusOr<std::vector<int32_t>>(
      const std::vector<tandem::v1::Observation>&)>
      render_opening;
  // The generation header's tokens (render_opening of no observations).
  // A prompt that ends with them is ready for the model: its samples
  // start at once and opening observations are refused. A prompt that
  // does not (and render_opening set) waits for its episodes' opens and
  // takes each one's render_opening tokens before its first turn.
  std::vector<int32_t> generation_header;
};

// One task: `params.n` samples of `prompt`, each its own episode opened
// with `open`.
struct EpisodeTask {
  std::string request_id;
  std::vector<int32_t> prompt;
  engine::SamplingParams params;
  tandem::v1::OpenEpisodeRequest open;
  // The task's reward range (PromptLease.reward_range; default [0, 1]).
  environment::RewardRange reward_range;
};

struct EpisodeResult {
  engine::FinishedSample sample;
  // The environment's reward, when it gave one.
  std::optional<double> reward;
  // "answered", "environment" (its own end), "max_turns",
  // "observation_too_large", "timeout", "error" (the environment's end
  // reasons), or the driver's: "turn_limit", "token_limit",
  // "environment_failed", "aborted".
  std::string end_reason;
  // The environment's end text, or the error that ended the episode.
  std::string end_text;
  int32_t tool_calls = 0;
  int32_t malformed_turns = 0;
};

class EpisodeDriver {
 public:
  // `engine` and `client` must outlive the driver.
  EpisodeDriver(engine::Engine* engine, EnvironmentClient* client,
                EpisodeCodec codec, chat::ToolCallFormat format,
                EpisodeLimits limits);

  // Opens the task's episodes and adds its samples to the engine (they
  // park at each turn end): at once when the prompt ends with the codec's
  // generation header (or the codec has no render_opening), else when
  // every open has answered, each sample with its own opening tokens
  // (EpisodeCodec::render_opening). InvalidArgument as Engine::Add, or for
  // a request id already running.
  absl::Status Start(EpisodeTask task);
  // Drops the tasks whose samples are not in the engine yet (waiting for
  // their opens): their episodes are closed, and their request ids
  // returned for the caller to give back. For the caller's AbortAll.
  std::vector<std::string> AbortUnstarted();
  // Handles turns that ended and environment replies. Call after every
  // engine step (and while idle: replies arrive when nothing runs).
  void Poll();
  // Looks for turn stop strings in the tokens the engine sampled for
  // episodes (Engine::TakeTokenEvents; others are ignored) and ends the
  // turns that wrote one (Engine::EndTurn). Call after every engine step,
  // before Poll().
  void OnTokens(const std::vector<engine::TokenEvent>& events);
  // Takes a finished sample of an episode (false, untouched, for any other
  // request).
  bool OnFinished(engine::FinishedSample& sample);
  std::vector<EpisodeResult> TakeFinished();
  // Episodes not yet finished.
  int32_t active() const { return static_cast<int32_t>(episodes_.size()); }

 private:
  struct Episode {
    std::string request_id;
    int32_t sample_index = 0;
    std::string episode_id;  // empty until opened
    bool open_failed = false;
    // The task waits for its opens before its samples enter the engine.
    bool awaiting_start = false;
    bool open_answered = false;
    // Its opening tokens (awaiting_start), or why it ends before its first
    // turn (reason empty: it starts).
    std::vector<int32_t> opening;
    std::string early_end_reason;
    std::string early_end_text;
    // A turn that ended and waits to be sent (the episode is not open yet).
    std::optional<engine::ParkedTurn> pending_turn;
    bool step_in_flight = false;
    bool ended = false;             // EndEpisode called; waiting for OnFinished
    int32_t completion_tokens = 0;  // output tokens at the last park
    int32_t turns = 0;              // model turns taken
    // The current turn's sampled tokens (turn stop strings only), and
    // whether EndTurn was asked for it.
    std::vector<int32_t> turn_tokens;
    bool turn_stopped = false;
    // The last turn parked by a stop string: its end-of-turn tokens are
    // still to be written.
    bool turn_open = false;
    environment::RewardRange reward_range;
    EpisodeResult result;
  };
  using Key = std::pair<std::string, int32_t>;
  static std::string KeyText(const Key& key);
  static std::optional<Key> ParseKey(const std::string& text);

  // A task whose samples wait for their episodes' opens.
  struct Unstarted {
    std::vector<int32_t> prompt;
    engine::SamplingParams params;
    int32_t waiting = 0;  // opens not answered yet
  };

  void HandleTurn(Episode& e, engine::ParkedTurn turn);
  // An open reply of an episode whose task waits for its opens.
  void HandleOpening(Episode& e, const EnvironmentReply& reply);
  // Adds a task whose opens have all answered to the engine; the episodes
  // that end before their first turn are aborted there at once.
  void StartOpened(const std::string& request_id);
  void SendTurn(Episode& e, const engine::ParkedTurn& turn);
  void HandleReply(EnvironmentReply reply);
  // Ends a parked episode with `reason`; its sample comes to OnFinished.
  void End(Episode& e, std::string reason, std::string text);

  engine::Engine* const engine_;
  EnvironmentClient* const client_;
  const EpisodeCodec codec_;
  // Tokens decoded at the end of a turn to look for a stop string: one per
  // byte of the longest (every token writes at least one), plus one.
  size_t stop_window_ = 0;
  const chat::ToolCallFormat format_;
  const EpisodeLimits limits_;
  std::map<Key, Episode> episodes_;
  std::map<std::string, Unstarted> unstarted_;
  // Keys of aborted episodes whose OpenEpisode was still in flight: closed
  // when it answers.
  std::set<std::string> orphaned_opens_;
  std::vector<EpisodeResult> finished_;
};

}  // namespace tandem::rollout
