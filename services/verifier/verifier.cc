#include "services/verifier/verifier.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_client.h"
#include "common/rpc/peer_identity.h"
#include "services/verifier/request_limits.h"

namespace tandem::verifier {
namespace {

auto Log() { return ComponentLogger("verifier"); }

// A cancellation this close to the caller's deadline is the deadline.
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(500);

// The caller's deadline of a call; InfiniteFuture when it set none.
absl::Time CallerDeadline(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  const auto now = std::chrono::system_clock::now();
  if (deadline >= now + std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

}  // namespace

// One admitted ScoreBatch call.
struct Verifier::Batch {
  BatchCall* reactor = nullptr;
  const tandem::v1::ScoreBatchRequest* request = nullptr;
  tandem::v1::ScoreBatchResponse* response = nullptr;
  int size = 0;
  absl::Time deadline = absl::InfiniteFuture();  // The caller's.
  // Set once by CancelBatch; running programs watch it.
  std::atomic<bool> cancelled{false};
  // Guarded by Verifier::mu_.
  int next = 0;        // The next item to start.
  int unfinished = 0;  // Items waiting or running.
  bool finished = false;
  absl::string_view stop_reason;  // kStopReasons, once cancelled.
};

// The reactor of a ScoreBatch call: OnCancel (the caller cancelled, its
// deadline passed, or the server is shutting down) stops the batch.
class Verifier::BatchCall : public grpc::ServerUnaryReactor {
 public:
  BatchCall(Verifier* verifier, std::shared_ptr<Batch> batch)
      : verifier_(verifier), batch_(std::move(batch)) {}

  void OnCancel() override { verifier_->CancelBatch(batch_); }
  void OnDone() override { delete this; }

 private:
  Verifier* const verifier_;
  const std::shared_ptr<Batch> batch_;
};

Verifier::Verifier(const VerifierConfig& config)
    : config_(config),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_) {
  for (int64_t i = 0; i < config.worker_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

absl::StatusOr<std::unique_ptr<Verifier>> Verifier::Create(
    const VerifierConfig& config) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<Verifier> verifier(new Verifier(config));
  BuiltinScorerConfig builtin;
  SandboxLimits& limits = builtin.sandbox.limits;
  limits.cpu_seconds = static_cast<int>(config.code_cpu_seconds);
  limits.wall_seconds = config.code_wall_seconds;
  limits.address_space_bytes = config.code_address_space_bytes;
  limits.max_output_bytes = config.code_max_output_bytes;
  limits.max_processes = static_cast<int>(config.code_max_processes);
  limits.allow_network_fallback = config.code_allow_network_fallback;
  builtin.sandbox.private_filesystem = config.code_private_filesystem;
  ScorerRegistry scorer_registry;
  RETURN_IF_ERROR(RegisterBuiltinScorers(builtin, &scorer_registry));
  std::vector<std::string> names = config.verifiers;
  if (names.empty()) names = scorer_registry.Names();
  const std::vector<std::string> known = scorer_registry.Names();
  for (const std::string& name : names) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("verifiers: unknown verifier '", name,
                       "' (known: ", absl::StrJoin(known, ", "), ")"));
    }
    ASSIGN_OR_RETURN(verifier->scorers_[name], scorer_registry.Create(name));
  }
  Verifier* self = verifier.get();
  verifier->environment_ = std::make_unique<EnvironmentService>(
      config.environment, &verifier->scorers_, *verifier->registry_,
      static_cast<int>(config.worker_threads),
      absl::Milliseconds(config.item_timeout_ms), config.server.tls.enabled(),
      [self](const char* reason) { self->metrics_.CountAuthRefused(reason); });
  ASSIGN_OR_RETURN(verifier->member_,
                   cluster::MemberDaemon::Create(
                       "verifier", tandem::v1::ROLE_VERIFIER, config.server,
                       config.coordinator_address, verifier->registry_,
                       {self, verifier->environment_.get()},
                       [self](tandem::v1::HeartbeatRequest* r) {
                         r->mutable_load()->set_running(
                             static_cast<uint32_t>(self->inflight_.load()));
                         if (self->stopping_) {
                           r->set_state(tandem::v1::MEMBER_STATE_DRAINING);
                         }
                       },
                       {{"verifiers", absl::StrJoin(names, ",")}}));
  Log()->info("verifiers: {}", absl::StrJoin(names, ", "));
  return verifier;
}

Verifier::~Verifier() { Stop(); }

absl::Status Verifier::Start() { return member_->Start(); }

absl::Status Verifier::ValidateBatch(
    const tandem::v1::ScoreBatchRequest& request) {
  for (int i = 0; i < request.items_size(); ++i) {
    const tandem::v1::ScoreItem& item = request.items(i);
    auto it = scorers_.find(item.verifier());
    if (it == scorers_.end()) {
      std::vector<std::string> known;
      for (const auto& [name, scorer] : scorers_) known.push_back(name);
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].verifier: unknown verifier '", item.verifier(),
          "' (known: ", absl::StrJoin(known, ", "), ")"));
    }
    ScoreRequest score_request;
    score_request.completion_text = item.completion_text();
    score_request.prompt_text = item.prompt_text();
    score_request.metadata.insert(item.metadata().begin(),
                                  item.metadata().end());
    absl::Status status = it->second->Validate(score_request);
    if (!status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "] (", item.verifier(), "): ", status.message()));
    }
  }
  return absl::OkStatus();
}

void Verifier::WorkerLoop() {
  while (true) {
    std::shared_ptr<Batch> batch;
    int index = 0;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return workers_stop_ || !ready_.empty();
      };
      mu_.Await(absl::Condition(&has_work));
      if (ready_.empty()) return;  // Stopping, and nothing waits.
      batch = std::move(ready_.front());
      ready_.pop_front();
      index = batch->next++;
      // Its next item goes to the back of the line: batches take turns.
      if (batch->next < batch->size) ready_.push_back(batch);
      metrics_.running().Set(static_cast<double>(++running_));
    }
    ScoreItem(batch, index);
    bool done = false;
    {
      absl::MutexLock lock(&mu_);
      metrics_.running().Set(static_cast<double>(--running_));
      done = --batch->unfinished == 0 && !batch->finished;
      if (done) batch->finished = true;
    }
    if (done) FinishBatch(*batch);
  }
}

void Verifier::ScoreItem(const std::shared_ptr<Batch>& batch_ptr, int index) {
  Batch& batch = *batch_ptr;
  // The caller's deadline may pass before gRPC tells (OnCancel): the first
  // item that sees it stops the batch, so that nothing more runs for it.
  if (absl::Now() >= batch.deadline) {
    CancelBatch(batch_ptr);
    return;
  }
  const tandem::v1::ScoreItem& item = batch.request->items(index);
  ScoreRequest score_request;
  score_request.completion_text = item.completion_text();
  score_request.prompt_text = item.prompt_text();
  score_request.metadata.insert(item.metadata().begin(),
                                item.metadata().end());
  const absl::Time start = absl::Now();
  const absl::Time own_deadline =
      start + absl::Milliseconds(config_.item_timeout_ms);
  score_request.deadline = std::min(own_deadline, batch.deadline);
  score_request.cancelled = &batch.cancelled;
  ScoreResult result = scorers_.at(item.verifier())->Score(score_request);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (absl::string_view kill : result.sandbox_kills) {
    metrics_.CountSandboxKill(kill);
  }
  if (result.stopped && absl::Now() >= batch.deadline) CancelBatch(batch_ptr);
  // An item stopped for its caller is counted by CancelBatch, and its
  // result is thrown away with the call.
  if (batch.cancelled.load()) return;
  if (result.stopped && own_deadline <= batch.deadline) {
    metrics_.CountStopped(kStopItemDeadline);
    result.reason = absl::StrCat("item_timeout_ms of ", config_.item_timeout_ms,
                                 " ms passed: ", result.reason);
  }
  metrics_.Observe(item.verifier(), result.outcome, seconds);
  tandem::v1::ScoreResult* out = batch.response->mutable_results(index);
  out->set_item_id(item.item_id());
  out->set_seconds(seconds);
  out->mutable_score()->set_reward(result.reward);
  out->mutable_score()->set_outcome(result.outcome);
  out->mutable_score()->set_reason(result.reason);
}

void Verifier::CancelBatch(const std::shared_ptr<Batch>& batch) {
  const absl::Time now = absl::Now();
  int stopped = 0;
  bool done = false;
  absl::string_view reason;
  {
    absl::MutexLock lock(&mu_);
    // Late (the call is answered already) or repeated: nothing to stop.
    if (batch->finished || !batch->stop_reason.empty()) return;
    batch->cancelled.store(true);
    // The client's own deadline reaches the server as a cancellation that
    // can arrive just before the server's copy of the deadline passes.
    reason = now >= batch->deadline - kDeadlineSlack ? kStopCallerDeadline
                                                     : kStopCancelled;
    batch->stop_reason = reason;
    stopped = batch->unfinished;  // Waiting ones and running ones.
    const int waiting = batch->size - batch->next;
    batch->next = batch->size;
    batch->unfinished -= waiting;
    ready_.erase(std::remove(ready_.begin(), ready_.end(), batch),
                 ready_.end());
    done = batch->unfinished == 0;
    if (done) batch->finished = true;
  }
  if (stopped > 0) metrics_.CountStopped(reason, stopped);
  Log()->warn("ScoreBatch of {} items {}: {} unfinished items stopped",
              batch->size,
              reason == kStopCallerDeadline ? "passed its caller's deadline"
                                            : "was cancelled by its caller",
              stopped);
  if (done) FinishBatch(*batch);
}

void Verifier::FinishBatch(Batch& batch) {
  inflight_.fetch_sub(batch.size);
  absl::string_view reason;
  {
    absl::MutexLock lock(&mu_);
    // Under the lock, so that the last of concurrent updates is the latest.
    metrics_.inflight().Set(static_cast<double>(inflight_.load()));
    reason = batch.stop_reason;
  }
  if (!batch.cancelled.load()) {
    batch.reactor->Finish(grpc::Status::OK);
    return;
  }
  batch.response->Clear();
  batch.reactor->Finish(
      reason == kStopCancelled
          ? grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller")
          : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                         "the caller's deadline passed; scoring stopped"));
}

grpc::ServerUnaryReactor* Verifier::ScoreBatch(
    grpc::CallbackServerContext* context,
    const tandem::v1::ScoreBatchRequest* request,
    tandem::v1::ScoreBatchResponse* response) {
  auto refuse = [context](grpc::Status status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(std::move(status));
    return reactor;
  };
  // Scoring runs candidate code in the sandbox: only the coordinator asks.
  if (absl::Status auth =
          rpc::AuthorizePeer(*context, config_.server.tls.enabled(),
                             "ScoreBatch", {rpc::PeerRole::kCoordinator});
      !auth.ok()) {
    const char* reason = auth.code() == absl::StatusCode::kUnauthenticated
                             ? "unauthenticated"
                             : "wrong_role";
    metrics_.CountAuthRefused(reason);
    Log()->warn("refused ScoreBatch from {} ({}): {}", context->peer(), reason,
                std::string(auth.message()));
    return refuse(rpc::ToGrpcStatus(auth));
  }
  if (stopping_) {
    return refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "verifier is shutting down"));
  }
  const int64_t n = request->items_size();
  if (n > config_.max_batch_items) {
    metrics_.CountRejected(kRejectBatchSize);
    return refuse(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("batch of ", n, " items exceeds max_batch_items (",
                     config_.max_batch_items, "); send smaller batches")));
  }
  if (absl::Status status = CheckVerifierRequestLimits(*request);
      !status.ok()) {
    metrics_.CountRejected(kRejectOversized);
    Log()->warn("refused ScoreBatch: {}", std::string(status.message()));
    return refuse(rpc::ToGrpcStatus(status));
  }
  if (absl::Status status = ValidateBatch(*request); !status.ok()) {
    return refuse(rpc::ToGrpcStatus(status));
  }
  if (n == 0) return refuse(grpc::Status::OK);
  const int64_t before = inflight_.fetch_add(n);
  if (before + n > config_.max_concurrency) {
    inflight_.fetch_sub(n);
    metrics_.CountRejected(kRejectBusy);
    return refuse(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("verifier busy: ", before, " items in flight + ", n,
                     " would pass max_concurrency (", config_.max_concurrency,
                     ")")));
  }
  for (int64_t i = 0; i < n; ++i) response->add_results();
  auto batch = std::make_shared<Batch>();
  batch->request = request;
  batch->response = response;
  batch->size = static_cast<int>(n);
  batch->unfinished = static_cast<int>(n);
  batch->deadline = CallerDeadline(*context);
  auto* reactor = new BatchCall(this, batch);
  batch->reactor = reactor;
  {
    absl::MutexLock lock(&mu_);
    metrics_.inflight().Set(static_cast<double>(inflight_.load()));
    // Unless the caller is gone already (CancelBatch finished it).
    if (!batch->finished && batch->next < batch->size) ready_.push_back(batch);
  }
  return reactor;
}

grpc::ServerUnaryReactor* Verifier::ListVerifiers(
    grpc::CallbackServerContext* context,
    const tandem::v1::ListVerifiersRequest* request,
    tandem::v1::ListVerifiersResponse* response) {
  for (const auto& [name, scorer] : scorers_) response->add_names(name);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void Verifier::GracefulStop(absl::Duration deadline) {
  stopping_ = true;
  member_->MarkNotServing();
  member_->Shutdown(deadline);
  Stop();
}

void Verifier::Stop() {
  stopping_ = true;
  if (stopped_.exchange(true)) return;
  // Shutting the server down cancels the calls still running, which stops
  // their items; then the threads have nothing left to do. Running
  // episode steps are cancelled first, so the shutdown does not wait for
  // their programs.
  if (environment_) environment_->Cancel();
  if (member_) member_->Shutdown(absl::ZeroDuration());
  {
    absl::MutexLock lock(&mu_);
    workers_stop_ = true;
    for (const std::shared_ptr<Batch>& batch : ready_) {
      batch->cancelled.store(true);
    }
  }
  for (std::thread& worker : workers_) worker.join();
  if (environment_) environment_->Stop();
}

}  // namespace tandem::verifier
