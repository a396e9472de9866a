#include "services/rollout/serving_queue.h"

#include <set>

namespace tandem::rollout {

ServedRequest::ServedRequest(std::string request_id,
                             std::vector<int32_t> prompt,
                             engine::SamplingParams params,
                             std::function<void()> notify)
    : request_id_(std::move(request_id)),
      prompt_(std::move(prompt)),
      params_(std::move(params)),
      notify_(std::move(notify)) {
  progress_.tokens.resize(params_.n);
  progress_.finished.assign(params_.n, engine::FinishReason::kNone);
}

ServedRequest::Progress ServedRequest::Take() {
  absl::MutexLock lock(&mu_);
  Progress out;
  out.tokens.resize(progress_.tokens.size());
  for (size_t i = 0; i < progress_.tokens.size(); ++i) {
    out.tokens[i].swap(progress_.tokens[i]);
  }
  out.finished = progress_.finished;
  out.error = progress_.error;
  return out;
}

void ServedRequest::AddToken(int32_t sample_index, const ServedToken& token) {
  absl::MutexLock lock(&mu_);
  if (sample_index < 0 ||
      sample_index >= static_cast<int32_t>(progress_.tokens.size())) {
    return;
  }
  progress_.tokens[sample_index].push_back(token);
}

void ServedRequest::Finish(int32_t sample_index, engine::FinishReason reason) {
  absl::MutexLock lock(&mu_);
  if (sample_index < 0 ||
      sample_index >= static_cast<int32_t>(progress_.finished.size())) {
    return;
  }
  progress_.finished[sample_index] = reason;
}

void ServedRequest::Fail(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (progress_.error.ok()) progress_.error = std::move(status);
  }
  notify_();
}

absl::Status ServingQueue::Submit(std::shared_ptr<ServedRequest> request) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    return absl::UnavailableError("the rollout worker is shutting down");
  }
  submitted_.push_back(std::move(request));
  return absl::OkStatus();
}

void ServingQueue::Cancel(const std::string& request_id, int32_t sample_index) {
  absl::MutexLock lock(&mu_);
  cancels_.emplace_back(request_id, sample_index);
}

void ServingQueue::WaitForWork(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto has_work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !submitted_.empty() || !cancels_.empty();
  };
  mu_.AwaitWithTimeout(absl::Condition(&has_work), timeout);
}

void ServingQueue::AdmitTo(engine::Engine* engine) {
  std::vector<std::shared_ptr<ServedRequest>> submitted;
  std::vector<std::pair<std::string, int32_t>> cancels;
  {
    absl::MutexLock lock(&mu_);
    if (submitted_.empty() && cancels_.empty()) return;
    submitted.swap(submitted_);
    cancels.swap(cancels_);
  }
  // A request cancelled before it reached the engine never enters it.
  std::set<std::string> cancelled_whole;
  for (const auto& [id, index] : cancels) {
    if (index < 0) cancelled_whole.insert(id);
  }
  for (std::shared_ptr<ServedRequest>& request : submitted) {
    if (cancelled_whole.count(request->request_id()) > 0) {
      request->Fail(absl::CancelledError("cancelled before it started"));
      continue;
    }
    absl::Status status = engine->Add(request->request_id(), request->prompt(),
                                      request->params());
    if (!status.ok()) {
      request->Fail(std::move(status));
      continue;
    }
    const std::string id = request->request_id();
    const int32_t n = request->params().n;
    admitted_[id] = {std::move(request), n};
  }
  for (const auto& [id, index] : cancels) {
    if (admitted_.count(id) > 0) engine->Abort(id, index);
  }
}

void ServingQueue::Dispatch(const std::vector<engine::TokenEvent>& events) {
  std::set<ServedRequest*> touched;
  for (const engine::TokenEvent& e : events) {
    auto it = admitted_.find(e.request_id);
    if (it == admitted_.end()) continue;
    it->second.request->AddToken(e.sample_index,
                                 {e.token, e.logprob, e.policy_version});
    touched.insert(it->second.request.get());
  }
  for (ServedRequest* request : touched) request->Notify();
}

bool ServingQueue::Dispatch(const engine::FinishedSample& sample) {
  auto it = admitted_.find(sample.request_id);
  if (it == admitted_.end()) return false;
  std::shared_ptr<ServedRequest> request = it->second.request;
  request->Finish(sample.sample_index, sample.finish_reason);
  if (--it->second.unfinished <= 0) admitted_.erase(it);
  request->Notify();
  return true;
}

void ServingQueue::FailAdmitted(const absl::Status& status) {
  std::map<std::string, Admitted> admitted;
  admitted.swap(admitted_);
  for (auto& [id, a] : admitted) a.request->Fail(status);
}

void ServingQueue::Close(const absl::Status& status) {
  std::vector<std::shared_ptr<ServedRequest>> submitted;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    submitted.swap(submitted_);
  }
  for (auto& request : submitted) request->Fail(status);
}

}  // namespace tandem::rollout
