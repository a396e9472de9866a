#pragma once

// ServingQueue is the second source of sequences of the rollout worker's
// engine, next to the coordinator's leases: requests of the OpenAI endpoint
// (openai_server.h) join the same continuous batch as the RL rollouts, and
// inflight weight updates apply to them as to any sequence.
//
// Threads: HTTP threads Submit() requests and Cancel() them; the engine
// thread (the worker's generation loop) moves submitted requests into the
// engine and cancels into Engine::Abort (AdmitTo), and hands every sampled
// token and finished sample of a served request back (Dispatch). Neither
// side ever waits for the other: the HTTP side learns of progress through
// the request's `notify` callback, which must not block (the server posts
// to its io_context).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"

namespace tandem::rollout {

// One sampled token of a served request.
struct ServedToken {
  int32_t token = 0;
  float logprob = 0.0f;
  uint64_t policy_version = 0;
};

// A request's generation state, shared by the HTTP session that made it and
// the engine thread. Thread-safe.
class ServedRequest {
 public:
  // Progress since the last Take().
  struct Progress {
    // Per sample: tokens sampled since the last Take().
    std::vector<std::vector<ServedToken>> tokens;
    // Per sample: kNone while running.
    std::vector<engine::FinishReason> finished;
    // Not OK when the engine refused or dropped the request.
    absl::Status error;
  };

  // `request_id` must be unique among the engine's requests (the server
  // uses "oai-<n>"). `notify` is called (from the engine thread, with no
  // lock held) after new progress; it must not block.
  ServedRequest(std::string request_id, std::vector<int32_t> prompt,
                engine::SamplingParams params, std::function<void()> notify);

  const std::string& request_id() const { return request_id_; }
  const std::vector<int32_t>& prompt() const { return prompt_; }
  const engine::SamplingParams& params() const { return params_; }

  Progress Take();

  // Engine thread.
  void AddToken(int32_t sample_index, const ServedToken& token);
  void Finish(int32_t sample_index, engine::FinishReason reason);
  void Fail(absl::Status status);
  void Notify() { notify_(); }

 private:
  const std::string request_id_;
  const std::vector<int32_t> prompt_;
  const engine::SamplingParams params_;
  const std::function<void()> notify_;
  absl::Mutex mu_;
  Progress progress_ ABSL_GUARDED_BY(mu_);
};

class ServingQueue {
 public:
  // Queues `request` for the engine. UNAVAILABLE once Close()d.
  absl::Status Submit(std::shared_ptr<ServedRequest> request);
  // Asks the engine to stop sample `sample_index` of the request (all of
  // them when < 0): it finishes with reason kAborted. Unknown ids are
  // ignored. Any thread.
  void Cancel(const std::string& request_id, int32_t sample_index = -1);

  // Engine thread, when its engine is idle: returns as soon as a request
  // or a cancellation is queued, or after `timeout`.
  void WaitForWork(absl::Duration timeout);
  // Engine thread: adds the submitted requests to `engine` (a refusal fails
  // that request with the engine's message) and applies cancellations.
  void AdmitTo(engine::Engine* engine);
  // Engine thread: routes tokens of served requests to them and notifies
  // each once.
  void Dispatch(const std::vector<engine::TokenEvent>& events);
  // Engine thread: true when `sample` belongs to a served request (it is
  // then routed there and must not be delivered as a rollout sample).
  bool Dispatch(const engine::FinishedSample& sample);
  // Engine thread: fails every admitted request (the engine dropped them
  // all, e.g. AbortAll after an engine error or at shutdown).
  void FailAdmitted(const absl::Status& status);
  // Refuses new requests and fails the queued ones (admitted ones are
  // failed by FailAdmitted on the engine thread). Any thread.
  void Close(const absl::Status& status);

  // Requests admitted to the engine and not finished (engine thread).
  size_t num_admitted() const { return admitted_.size(); }

 private:
  struct Admitted {
    std::shared_ptr<ServedRequest> request;
    int32_t unfinished = 0;
  };

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<ServedRequest>> submitted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, int32_t>> cancels_ ABSL_GUARDED_BY(mu_);
  // Engine thread only.
  std::map<std::string, Admitted> admitted_;
};

}  // namespace tandem::rollout
