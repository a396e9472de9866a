#pragma once

// A Sequence is one sample being generated: its prompt, the tokens sampled
// so far with their behavior log-probs and policy versions, and its place in
// the KV cache. Sequences are owned by the Engine and touched only by the
// engine thread.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace tandem::engine {

struct SamplingParams {
  // 0 = greedy.
  float temperature = 1.0f;
  // Nucleus mass in (0, 1]; 1 disables.
  float top_p = 1.0f;
  // Keep the k most likely tokens; 0 disables.
  int32_t top_k = 0;
  // Generated tokens per sample (> 0).
  int32_t max_tokens = 16;
  // Tokens that end a sample (kept as its last token).
  std::vector<int32_t> stop_token_ids;
  // Sample i of a request uses seed + i; 0 draws a random seed.
  uint64_t seed = 0;
  // Samples per prompt; they share the prompt's prefill.
  int32_t n = 1;
  // Report every sampled token through Engine::TakeTokenEvents as it is
  // produced (the OpenAI endpoint streams them); rollouts leave it off.
  bool report_tokens = false;
  // Multi-turn episodes: when a model turn ends (a stop token, an EOS, or
  // max_tokens for the turn) the sequence is parked with its KV cache
  // instead of retired, and reported by Engine::TakeParked; the caller
  // resumes it with the environment's tokens (Engine::Resume) or ends it
  // (Engine::EndEpisode). max_tokens is the first turn's budget.
  bool park_at_turn_end = false;
};

enum class FinishReason { kNone, kStop, kLength, kAborted };
const char* FinishReasonName(FinishReason reason);

// Consecutive generated tokens produced under one policy version.
struct VersionSpan {
  uint64_t policy_version = 0;
  uint32_t num_tokens = 0;
  bool operator==(const VersionSpan&) const = default;
};

// Who wrote a completion token: the model (trained) or the environment
// (context only).
enum class TokenSource : uint8_t { kModel, kEnvironment };

// Consecutive completion tokens from one source.
struct SourceSpan {
  TokenSource source = TokenSource::kModel;
  uint32_t num_tokens = 0;
  bool operator==(const SourceSpan&) const = default;
};

// kParked: a multi-turn sequence between turns, waiting for its
// environment. It takes no batch slot; it keeps its KV blocks until memory
// pressure reclaims them (see Scheduler).
enum class SequenceStatus { kWaiting, kRunning, kParked, kFinished };

struct Sequence {
  uint64_t id = 0;
  // The request this sample belongs to and its index inside it.
  std::string request_id;
  int32_t sample_index = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::vector<float> logprobs;
  std::vector<VersionSpan> spans;
  // Empty while every output token is the model's; once the environment
  // appended tokens, run lengths covering the whole output.
  std::vector<SourceSpan> sources;
  // Multi-turn bookkeeping: the current turn's first output token, the
  // output length at which the turn hits its token budget, turns begun.
  int32_t turn_start = 0;
  int32_t turn_limit = 0;
  int32_t turns = 1;
  // Parked and resumed: the scheduler moves it back into the batch as soon
  // as a slot is free.
  bool resume_ready = false;
  SamplingParams params;
  std::mt19937_64 rng;

  SequenceStatus status = SequenceStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  // Tokens (prompt then output) whose keys/values are in the KV cache.
  int32_t num_cached = 0;
  // KV blocks held, in order.
  std::vector<int32_t> blocks;
  uint32_t preemptions = 0;
  // Admission order, for preemption (latest admitted goes first).
  uint64_t admitted_seq = 0;
  absl::Time arrival;
  absl::Time admitted;
  absl::Time first_token;
  absl::Time finished;

  int32_t total_len() const {
    return static_cast<int32_t>(prompt.size() + output.size());
  }
  int32_t token_at(int32_t i) const {
    return i < static_cast<int32_t>(prompt.size())
               ? prompt[i]
               : output[i - static_cast<int32_t>(prompt.size())];
  }
  // Appends a sampled token under `version`, extending the last span.
  void Append(int32_t token, float logprob, uint64_t version);
  // Appends environment tokens: log-prob 0 and the version of the turn
  // before them (the version spans cover every output token), source
  // kEnvironment. Starts the next model turn after them.
  void AppendEnvironment(const std::vector<int32_t>& tokens);
};

}  // namespace tandem::engine
