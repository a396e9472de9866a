#pragma once

// Engine: continuous-batching generation with inflight weight updates.
//
// Each Step() (1) applies a ready weight update at the step boundary
// according to the update policy, (2) asks the Scheduler what to compute,
// (3) runs the model once over all chunks, (4) samples one token for every
// sequence whose chunk reached its end, recording the token's behavior
// log-prob and the live policy version, and (5) retires finished samples.
// Not thread-safe: one thread drives Step(); Add() and TakeFinished() are
// called from that thread too (the service layer queues work for it).
//
// Multi-turn episodes (SamplingParams::park_at_turn_end): a turn that ends
// parks its sequence with its KV cache (TakeParked reports it); while its
// environment answers, the other sequences keep the batch. Resume() appends
// the environment's tokens, which are prefilled as one chunk before
// decoding continues; a weight commit between turns simply makes the next
// turn's tokens carry the new version (or, under kRecompute, drops parked
// caches too). EndEpisode() retires it; Abort() works on parked sequences.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/block_manager.h"
#include "engine/engine_model.h"
#include "engine/scheduler.h"

namespace tandem::engine {

struct EngineOptions {
  SchedulerLimits limits;
  int32_t num_kv_blocks = 1024;
  int32_t block_size = 16;
  // Continuous batching admits as soon as capacity frees; static batching
  // (a benchmark baseline) admits only into an empty batch.
  bool static_batching = false;
  // kInflight: commit at the next step boundary; kDrain (baseline): stop
  // admitting, finish every running sequence, then commit.
  enum class UpdatePolicy {
    kInflight,
    kDrain
  } update_policy = UpdatePolicy::kInflight;
  // After a commit, running sequences keep their KV cache (PipelineRL) or
  // recompute it under the new weights.
  enum class KvPolicy { kKeep, kRecompute } kv_policy = KvPolicy::kKeep;
  // Tokens that end every sample (the model's end of sequence).
  std::vector<int32_t> eos_token_ids;
};

struct FinishedSample {
  std::string request_id;
  int32_t sample_index = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::vector<float> logprobs;
  std::vector<VersionSpan> spans;
  // Empty unless the environment wrote tokens (a multi-turn episode); then
  // covers `output` exactly.
  std::vector<SourceSpan> source_spans;
  // Model turns begun (1 for a single-turn sample).
  int32_t turns = 1;
  FinishReason finish_reason = FinishReason::kNone;
  uint32_t preemptions = 0;
  absl::Time admitted, first_token, finished;
};

// A model turn that ended; its sequence is parked (park_at_turn_end).
struct ParkedTurn {
  std::string request_id;
  int32_t sample_index = 0;
  // kStop (stop token, EOS, or EndTurn) or kLength (the turn's budget).
  FinishReason reason = FinishReason::kNone;
  // The turn's tokens (its end token included), their first index in the
  // sample's output, and the version of its last token.
  std::vector<int32_t> turn_tokens;
  int32_t turn_start = 0;
  int32_t turn = 1;
  uint64_t policy_version = 0;
  // Prompt plus output so far, for the caller's budget checks.
  int32_t total_len = 0;
};

// One token sampled for a sequence whose params.report_tokens is set.
struct TokenEvent {
  std::string request_id;
  int32_t sample_index = 0;
  int32_t token = 0;
  float logprob = 0.0f;
  uint64_t policy_version = 0;
};

// What one step did; the service layer turns it into metrics.
struct StepStats {
  int32_t prefill_tokens = 0;
  int32_t decode_tokens = 0;  // sequences that sampled a token
  int32_t preempted = 0;
  int32_t finished = 0;
  bool committed_update = false;
  uint64_t committed_version = 0;
  double pause_seconds = 0.0;  // time spent committing (0 without update)
  double step_seconds = 0.0;
};

struct EngineSnapshot {
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t parked = 0;
  int32_t kv_blocks_used = 0;
  int32_t kv_blocks_total = 0;
  uint64_t policy_version = 0;
  uint64_t generated_tokens = 0;
  uint64_t preemptions = 0;
};

class Engine {
 public:
  // `model` and `weights` (may be null: no updates) must outlive the engine.
  Engine(EngineOptions options, EngineModel* model, WeightUpdateSource* weights,
         uint64_t initial_version);
  ~Engine();

  // Queues a request: params.n samples of `prompt`. `opening`, empty or
  // one run per sample: environment tokens that follow the prompt before
  // the sample's first turn (an episode's opening observations; output
  // tokens with log-prob 0, source kEnvironment, the live version); the
  // samples still share the prompt's prefill. InvalidArgument for an empty
  // prompt, n < 1, max_tokens < 1, an `opening` of another size than n, or
  // a prompt (plus the longest opening) that cannot fit in the whole KV
  // cache.
  absl::Status Add(const std::string& request_id, std::vector<int32_t> prompt,
                   const SamplingParams& params,
                   const std::vector<std::vector<int32_t>>& opening = {});
  // Add's checks of a request with a prompt of `prompt_len` tokens and
  // openings of at most `opening_len`, without adding it.
  absl::Status CheckAdd(const std::string& request_id, int64_t prompt_len,
                        const SamplingParams& params,
                        int64_t opening_len = 0) const;
  // One engine step. Errors come from the model.
  absl::StatusOr<StepStats> Step();
  // Samples finished since the last call.
  std::vector<FinishedSample> TakeFinished();
  // Aborts every unfinished sample and returns their request ids.
  std::vector<std::string> AbortAll();
  // Aborts the unfinished samples of `request_id` (only sample
  // `sample_index` when it is >= 0): they go to TakeFinished with reason
  // kAborted and the tokens they had. Returns how many were aborted.
  int32_t Abort(const std::string& request_id, int32_t sample_index = -1);
  // Tokens sampled since the last call for sequences that asked for them
  // (SamplingParams::report_tokens), in the order they were sampled.
  std::vector<TokenEvent> TakeTokenEvents();

  // Turns that ended (sequences parked) since the last call.
  std::vector<ParkedTurn> TakeParked();
  // Continues a parked sample: appends `environment_tokens` (may be empty)
  // as the environment's, then lets the model generate up to
  // `max_turn_tokens` more. NotFound for an unknown sample,
  // FailedPrecondition when it is not parked, InvalidArgument when
  // max_turn_tokens < 1 or the sequence could then outgrow the whole KV
  // cache (the sample stays parked: end it).
  absl::Status Resume(const std::string& request_id, int32_t sample_index,
                      const std::vector<int32_t>& environment_tokens,
                      int32_t max_turn_tokens);
  // Retires a parked sample with `reason`: it goes to TakeFinished with
  // every turn so far. NotFound / FailedPrecondition as for Resume.
  absl::Status EndEpisode(const std::string& request_id, int32_t sample_index,
                          FinishReason reason = FinishReason::kStop);
  // Ends the current model turn of a running or waiting sample that parks
  // at turn ends, at this step boundary (the caller saw a stop string): it
  // is parked and reported like a stop token. FailedPrecondition when the
  // sample does not park at turn ends or has no token of this turn yet.
  absl::Status EndTurn(const std::string& request_id, int32_t sample_index);

  bool idle() const { return scheduler_.idle() && pending_siblings_.empty(); }
  EngineSnapshot Snapshot() const;
  uint64_t policy_version() const { return version_; }

 private:
  absl::Status MaybeCommitUpdate(StepStats* stats);
  int32_t TryFork(Sequence* seq);
  void Retire(Sequence* seq, FinishReason reason);
  void Park(Sequence* seq, FinishReason reason);
  // The sample's sequence, or NotFound.
  absl::StatusOr<Sequence*> Find(const std::string& request_id,
                                 int32_t sample_index);

  const EngineOptions options_;
  EngineModel* const model_;
  WeightUpdateSource* const weights_;
  BlockManager blocks_;
  Scheduler scheduler_;
  uint64_t version_;
  bool draining_for_update_ = false;
  uint64_t next_seq_id_ = 1;
  uint64_t generated_tokens_ = 0;
  uint64_t preemptions_ = 0;
  std::map<uint64_t, std::unique_ptr<Sequence>> sequences_;
  // request id -> id of the sample that prefills the shared prompt.
  std::map<std::string, uint64_t> leaders_;
  // Samples 1..n-1 of a request wait here until sample 0 has its prompt
  // cached, then join the queue and copy that cache instead of prefilling.
  std::map<std::string, std::vector<Sequence*>> pending_siblings_;
  std::vector<FinishedSample> finished_;
  std::vector<TokenEvent> token_events_;
  std::vector<ParkedTurn> parked_;
};

}  // namespace tandem::engine
