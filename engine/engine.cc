#include "engine/engine.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/sampler.h"

namespace tandem::engine {

Engine::Engine(EngineOptions options, EngineModel* model,
               WeightUpdateSource* weights, uint64_t initial_version)
    : options_(std::move(options)),
      model_(model),
      weights_(weights),
      blocks_(options_.num_kv_blocks, options_.block_size),
      scheduler_(options_.limits, &blocks_),
      version_(initial_version) {}

Engine::~Engine() = default;

absl::Status Engine::CheckAdd(const std::string& request_id, int64_t prompt_len,
                              const SamplingParams& params,
                              int64_t opening_len) const {
  if (prompt_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request_id, ": prompt is empty"));
  }
  if (params.n < 1 || params.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", request_id, ": n and max_tokens must be >= 1, got n=",
        params.n, " max_tokens=", params.max_tokens));
  }
  const int64_t longest = prompt_len + opening_len + params.max_tokens;
  if (blocks_.BlocksFor(static_cast<int32_t>(
          std::min<int64_t>(longest, INT32_MAX))) > blocks_.num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", request_id, ": prompt (", prompt_len, " tokens) + ",
        opening_len > 0 ? absl::StrCat("opening (", opening_len, " tokens) + ")
                        : std::string(),
        "max_tokens (", params.max_tokens, ") exceeds the whole KV cache (",
        blocks_.num_blocks(), " blocks of ", blocks_.block_size(), ")"));
  }
  return absl::OkStatus();
}

absl::Status Engine::Add(const std::string& request_id,
                         std::vector<int32_t> prompt,
                         const SamplingParams& params,
                         const std::vector<std::vector<int32_t>>& opening) {
  if (!opening.empty() && static_cast<int32_t>(opening.size()) != params.n) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request_id, ": ", opening.size(),
                     " opening token runs for n=", params.n,
                     " samples; give one per sample or none"));
  }
  size_t longest_opening = 0;
  for (const std::vector<int32_t>& tokens : opening) {
    longest_opening = std::max(longest_opening, tokens.size());
  }
  absl::Status fits = CheckAdd(request_id, static_cast<int64_t>(prompt.size()),
                               params, static_cast<int64_t>(longest_opening));
  if (!fits.ok()) return fits;
  const absl::Time now = absl::Now();
  std::vector<Sequence*> siblings;
  for (int32_t i = 0; i < params.n; ++i) {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_seq_id_++;
    seq->request_id = request_id;
    seq->sample_index = i;
    seq->prompt = prompt;
    seq->params = params;
    if (!opening.empty() && !opening[i].empty()) {
      // The environment's opening tokens carry the live version, as the
      // tokens of a turn sampled now would.
      seq->spans.push_back({version_, 0});
      seq->AppendEnvironment(opening[i]);
    }
    seq->turn_limit = seq->turn_start + params.max_tokens;
    seq->rng.seed(params.seed != 0 ? params.seed + i : std::random_device{}());
    seq->arrival = now;
    Sequence* raw = seq.get();
    sequences_[raw->id] = std::move(seq);
    if (i == 0) {
      leaders_[request_id] = raw->id;
      scheduler_.AddWaiting(raw);
    } else {
      siblings.push_back(raw);
    }
  }
  if (!siblings.empty()) pending_siblings_[request_id] = std::move(siblings);
  return absl::OkStatus();
}

int32_t Engine::TryFork(Sequence* seq) {
  auto leader_it = leaders_.find(seq->request_id);
  if (leader_it == leaders_.end() || leader_it->second == seq->id) return 0;
  auto it = sequences_.find(leader_it->second);
  const int32_t shared = static_cast<int32_t>(seq->prompt.size()) - 1;
  if (it == sequences_.end() || shared <= 0 ||
      it->second->num_cached < shared) {
    return 0;
  }
  return model_->ForkCache(it->second->id, seq->id, shared) ? shared : 0;
}

absl::Status Engine::MaybeCommitUpdate(StepStats* stats) {
  if (weights_ == nullptr) return absl::OkStatus();
  const uint64_t ready = weights_->ReadyVersion(version_);
  if (ready == 0) {
    draining_for_update_ = false;
    return absl::OkStatus();
  }
  if (options_.update_policy == EngineOptions::UpdatePolicy::kDrain &&
      !scheduler_.running().empty()) {
    draining_for_update_ = true;  // finish what runs, admit nothing
    return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(const uint64_t live, weights_->Commit(ready));
  version_ = live;
  if (options_.kv_policy == EngineOptions::KvPolicy::kRecompute) {
    for (Sequence* seq : scheduler_.RecomputeAll()) {
      model_->ReleaseCache(seq->id);
    }
  }
  draining_for_update_ = false;
  stats->committed_update = true;
  stats->committed_version = live;
  stats->pause_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SampledToken>> EngineModel::ForwardSample(
    const std::vector<ForwardChunk>& chunks,
    const std::vector<SampleRequest>& requests) {
  ASSIGN_OR_RETURN(std::vector<float> logits, Forward(chunks));
  const int32_t vocab = vocab_size();
  if (logits.size() != requests.size() * static_cast<size_t>(vocab)) {
    return absl::InternalError(
        absl::StrCat("Forward returned ", logits.size(), " logits for ",
                     requests.size(), " sampled rows of ", vocab));
  }
  std::vector<SampledToken> out;
  out.reserve(requests.size());
  for (size_t row = 0; row < requests.size(); ++row) {
    out.push_back(SampleTokenWithUniform(logits.data() + row * vocab, vocab,
                                         *requests[row].params,
                                         requests[row].uniform));
  }
  return out;
}

absl::StatusOr<StepStats> Engine::Step() {
  const absl::Time step_start = absl::Now();
  StepStats stats;
  RETURN_IF_ERROR(MaybeCommitUpdate(&stats));
  const Scheduler::Admission admission =
      draining_for_update_       ? Scheduler::Admission::kNone
      : options_.static_batching ? Scheduler::Admission::kStatic
                                 : Scheduler::Admission::kContinuous;
  SchedulePlan plan = scheduler_.Schedule(
      admission, [this](Sequence* s) { return TryFork(s); });
  for (Sequence* seq : plan.preempted) {
    model_->ReleaseCache(seq->id);
    ++preemptions_;
  }
  stats.preempted = static_cast<int32_t>(plan.preempted.size());
  if (plan.chunks.empty()) {
    if (weights_ != nullptr) weights_->StepDone();
    stats.step_seconds = absl::ToDoubleSeconds(absl::Now() - step_start);
    return stats;
  }
  std::vector<ForwardChunk> chunks;
  chunks.reserve(plan.chunks.size());
  for (const ScheduledChunk& c : plan.chunks) {
    chunks.push_back({c.seq, c.start, c.end, c.samples()});
  }
  // One uniform draw per sampled row from the sequence's own generator
  // (none when greedy), in chunk order, wherever the model samples.
  std::vector<SampleRequest> requests;
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.samples()) continue;
    SampleRequest r;
    r.params = &c.seq->params;
    if (c.seq->params.temperature > 0.0f) {
      r.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(c.seq->rng);
    }
    requests.push_back(r);
  }
  absl::StatusOr<std::vector<SampledToken>> forward =
      model_->ForwardSample(chunks, requests);
  // The weights are free from here on.
  if (weights_ != nullptr) weights_->StepDone();
  ASSIGN_OR_RETURN(std::vector<SampledToken> sampled_rows, std::move(forward));
  if (sampled_rows.size() != requests.size()) {
    return absl::InternalError(
        absl::StrCat("the model sampled ", sampled_rows.size(), " tokens for ",
                     requests.size(), " rows"));
  }
  const absl::Time now = absl::Now();
  size_t row = 0;
  std::vector<Sequence*> done;
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence* seq = c.seq;
    const bool samples = c.samples();
    seq->num_cached = c.end;
    if (!samples) {
      stats.prefill_tokens += c.end - c.start;
      continue;
    }
    if (c.end - c.start > 1 || seq->output.empty()) {
      stats.prefill_tokens += c.end - c.start;
    }
    const SampledToken sampled = sampled_rows[row];
    ++row;
    seq->Append(sampled.token, sampled.logprob, version_);
    if (seq->params.report_tokens) {
      token_events_.push_back({seq->request_id, seq->sample_index,
                               sampled.token, sampled.logprob, version_});
    }
    ++generated_tokens_;
    ++stats.decode_tokens;
    // The first sampled token (after any opening environment tokens).
    if (seq->turns == 1 &&
        static_cast<int32_t>(seq->output.size()) == seq->turn_start + 1) {
      seq->first_token = now;
      // The leader's prompt is cached: its siblings can now share it.
      auto pending = pending_siblings_.find(seq->request_id);
      if (seq->sample_index == 0 && pending != pending_siblings_.end()) {
        for (auto it = pending->second.rbegin(); it != pending->second.rend();
             ++it) {
          scheduler_.AddWaitingFront(*it);
        }
        pending_siblings_.erase(pending);
      }
    }
    const auto& stops = seq->params.stop_token_ids;
    const bool stop =
        std::find(stops.begin(), stops.end(), sampled.token) != stops.end() ||
        std::find(options_.eos_token_ids.begin(), options_.eos_token_ids.end(),
                  sampled.token) != options_.eos_token_ids.end();
    if (stop) {
      seq->finish_reason = FinishReason::kStop;
      done.push_back(seq);
    } else if (static_cast<int32_t>(seq->output.size()) >= seq->turn_limit) {
      seq->finish_reason = FinishReason::kLength;
      done.push_back(seq);
    }
  }
  for (Sequence* seq : done) {
    if (seq->params.park_at_turn_end) {
      Park(seq, seq->finish_reason);
    } else {
      Retire(seq, seq->finish_reason);
    }
  }
  stats.finished = static_cast<int32_t>(done.size());
  stats.step_seconds = absl::ToDoubleSeconds(absl::Now() - step_start);
  return stats;
}

void Engine::Retire(Sequence* seq, FinishReason reason) {
  FinishedSample sample;
  sample.request_id = seq->request_id;
  sample.sample_index = seq->sample_index;
  sample.prompt = seq->prompt;
  sample.output = std::move(seq->output);
  sample.logprobs = std::move(seq->logprobs);
  sample.spans = std::move(seq->spans);
  sample.source_spans = std::move(seq->sources);
  sample.turns = seq->turns;
  sample.finish_reason = reason;
  sample.preemptions = seq->preemptions;
  sample.admitted = seq->admitted;
  sample.first_token = seq->first_token;
  sample.finished = absl::Now();
  finished_.push_back(std::move(sample));
  scheduler_.Finish(seq);
  model_->ReleaseCache(seq->id);
  auto leader = leaders_.find(seq->request_id);
  if (leader != leaders_.end() && leader->second == seq->id) {
    leaders_.erase(leader);
  }
  sequences_.erase(seq->id);
}

std::vector<FinishedSample> Engine::TakeFinished() {
  std::vector<FinishedSample> out;
  out.swap(finished_);
  return out;
}

std::vector<std::string> Engine::AbortAll() {
  std::vector<std::string> requests;
  for (auto& [id, seq] : sequences_) {
    requests.push_back(seq->request_id);
    model_->ReleaseCache(id);
  }
  std::sort(requests.begin(), requests.end());
  requests.erase(std::unique(requests.begin(), requests.end()), requests.end());
  scheduler_.Clear();
  sequences_.clear();
  leaders_.clear();
  pending_siblings_.clear();
  return requests;
}

int32_t Engine::Abort(const std::string& request_id, int32_t sample_index) {
  std::vector<Sequence*> victims;
  for (auto& [id, seq] : sequences_) {
    if (seq->request_id == request_id &&
        (sample_index < 0 || seq->sample_index == sample_index)) {
      victims.push_back(seq.get());
    }
  }
  auto pending = pending_siblings_.find(request_id);
  for (Sequence* seq : victims) {
    if (pending != pending_siblings_.end()) {
      auto& waiting = pending->second;
      waiting.erase(std::remove(waiting.begin(), waiting.end(), seq),
                    waiting.end());
    }
    scheduler_.Remove(seq);
  }
  // Siblings still waiting for an aborted leader's prompt cache prefill it
  // themselves.
  if (pending != pending_siblings_.end()) {
    auto leader = leaders_.find(request_id);
    const bool leader_aborted =
        leader != leaders_.end() &&
        std::any_of(victims.begin(), victims.end(),
                    [&](Sequence* s) { return s->id == leader->second; });
    if (leader_aborted || pending->second.empty()) {
      for (auto it = pending->second.rbegin(); it != pending->second.rend();
           ++it) {
        scheduler_.AddWaitingFront(*it);
      }
      pending_siblings_.erase(pending);
    }
  }
  for (Sequence* seq : victims) Retire(seq, FinishReason::kAborted);
  return static_cast<int32_t>(victims.size());
}

std::vector<TokenEvent> Engine::TakeTokenEvents() {
  std::vector<TokenEvent> out;
  out.swap(token_events_);
  return out;
}

EngineSnapshot Engine::Snapshot() const {
  EngineSnapshot s;
  s.running = static_cast<int32_t>(scheduler_.running().size());
  s.waiting = static_cast<int32_t>(scheduler_.num_waiting());
  s.parked = static_cast<int32_t>(scheduler_.num_parked());
  for (const auto& [request, siblings] : pending_siblings_) {
    s.waiting += static_cast<int32_t>(siblings.size());
  }
  s.kv_blocks_used = blocks_.num_used();
  s.kv_blocks_total = blocks_.num_blocks();
  s.policy_version = version_;
  s.generated_tokens = generated_tokens_;
  s.preemptions = preemptions_;
  return s;
}

}  // namespace tandem::engine
