// Engine: the turn boundary of multi-turn episodes (park, resume, end).

#include "absl/strings/str_cat.h"
#include "engine/engine.h"

namespace tandem::engine {

absl::StatusOr<Sequence*> Engine::Find(const std::string& request_id,
                                       int32_t sample_index) {
  for (auto& [id, seq] : sequences_) {
    if (seq->request_id == request_id && seq->sample_index == sample_index) {
      return seq.get();
    }
  }
  return absl::NotFoundError(absl::StrCat("request ", request_id, " sample ",
                                          sample_index, ": no such sample"));
}

void Engine::Park(Sequence* seq, FinishReason reason) {
  seq->finish_reason = FinishReason::kNone;
  scheduler_.Park(seq);
  ParkedTurn turn;
  turn.request_id = seq->request_id;
  turn.sample_index = seq->sample_index;
  turn.reason = reason;
  turn.turn_start = seq->turn_start;
  turn.turn_tokens.assign(seq->output.begin() + seq->turn_start,
                          seq->output.end());
  turn.turn = seq->turns;
  turn.policy_version =
      seq->spans.empty() ? version_ : seq->spans.back().policy_version;
  turn.total_len = seq->total_len();
  parked_.push_back(std::move(turn));
}

std::vector<ParkedTurn> Engine::TakeParked() {
  std::vector<ParkedTurn> out;
  out.swap(parked_);
  return out;
}

absl::Status Engine::Resume(const std::string& request_id, int32_t sample_index,
                            const std::vector<int32_t>& environment_tokens,
                            int32_t max_turn_tokens) {
  absl::StatusOr<Sequence*> found = Find(request_id, sample_index);
  if (!found.ok()) return found.status();
  Sequence* seq = *found;
  if (seq->status != SequenceStatus::kParked || seq->resume_ready) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_id, " sample ", sample_index,
                     ": Resume of a sample that is not parked"));
  }
  if (max_turn_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request_id, " sample ", sample_index,
                     ": max_turn_tokens must be >= 1, got ", max_turn_tokens));
  }
  const int64_t longest = static_cast<int64_t>(seq->total_len()) +
                          environment_tokens.size() + max_turn_tokens;
  if (longest > INT32_MAX ||
      blocks_.BlocksFor(static_cast<int32_t>(longest)) > blocks_.num_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request_id, " sample ", sample_index, ": ",
                     seq->total_len(), " tokens + ", environment_tokens.size(),
                     " environment tokens + max_turn_tokens (", max_turn_tokens,
                     ") exceed the whole KV cache (", blocks_.num_blocks(),
                     " blocks of ", blocks_.block_size(), ")"));
  }
  seq->AppendEnvironment(environment_tokens);
  seq->turn_start = static_cast<int32_t>(seq->output.size());
  seq->turn_limit = seq->turn_start + max_turn_tokens;
  ++seq->turns;
  scheduler_.Resume(seq);
  return absl::OkStatus();
}

absl::Status Engine::EndEpisode(const std::string& request_id,
                                int32_t sample_index, FinishReason reason) {
  absl::StatusOr<Sequence*> found = Find(request_id, sample_index);
  if (!found.ok()) return found.status();
  Sequence* seq = *found;
  if (seq->status != SequenceStatus::kParked || seq->resume_ready) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_id, " sample ", sample_index,
                     ": EndEpisode of a sample that is not parked"));
  }
  Retire(seq, reason);
  return absl::OkStatus();
}

absl::Status Engine::EndTurn(const std::string& request_id,
                             int32_t sample_index) {
  absl::StatusOr<Sequence*> found = Find(request_id, sample_index);
  if (!found.ok()) return found.status();
  Sequence* seq = *found;
  if (!seq->params.park_at_turn_end) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_id, " sample ", sample_index,
                     ": EndTurn of a sample without park_at_turn_end"));
  }
  const bool active = seq->status == SequenceStatus::kRunning ||
                      seq->status == SequenceStatus::kWaiting;
  if (!active || static_cast<int32_t>(seq->output.size()) <= seq->turn_start) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_id, " sample ", sample_index,
                     ": EndTurn needs a running turn with at least one token"));
  }
  Park(seq, FinishReason::kStop);
  return absl::OkStatus();
}

}  // namespace tandem::engine
