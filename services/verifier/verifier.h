#pragma once

// The reward verifier daemon: scores batches of completions with the
// verifiers of the scorer registry.
//
// Admission is bounded: a batch of more than max_batch_items items, or one
// that would take the items admitted (waiting or running) past
// max_concurrency, is refused with RESOURCE_EXHAUSTED naming the limit;
// the caller retries later or elsewhere.
//
// Admitted items are scored in parallel on worker_threads threads; batches
// take turns item by item (round robin), so a small batch submitted while
// a large slow one is scoring waits at most for one item to end, not for
// the whole slow batch.
//
// Deadlines: each item has item_timeout_ms from when its thread starts it;
// past it its running program is killed and it scores 0 (timeout). A
// batch's deadline is its caller's gRPC deadline: when that passes or the
// caller cancels, the batch's running programs are killed (within about
// 50 ms), its waiting items are dropped, and the call ends with
// DEADLINE_EXCEEDED / CANCELLED; no work keeps running for a dead call.

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cluster/member_daemon.h"
#include "services/verifier/environment/environment_service.h"
#include "services/verifier/scoring/scorer_registry.h"
#include "services/verifier/verifier_config.h"
#include "services/verifier/verifier_metrics.h"
#include "tandem/v1/verifier.grpc.pb.h"

namespace tandem::verifier {

class Verifier : public tandem::v1::Verifier::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<Verifier>> Create(
      const VerifierConfig& config);
  ~Verifier() override;

  absl::Status Start();
  // Health NOT_SERVING, new batches refused with UNAVAILABLE, batches being
  // scored finish (each bounded by the sandbox limits), then stop.
  void GracefulStop(absl::Duration deadline);
  void Stop();

  // host:port of the gRPC server (bound at Create).
  const std::string& grpc_address() const { return member_->grpc_address(); }

  // tandem.v1.Verifier
  grpc::ServerUnaryReactor* ScoreBatch(
      grpc::CallbackServerContext* context,
      const tandem::v1::ScoreBatchRequest* request,
      tandem::v1::ScoreBatchResponse* response) override;
  grpc::ServerUnaryReactor* ListVerifiers(
      grpc::CallbackServerContext* context,
      const tandem::v1::ListVerifiersRequest* request,
      tandem::v1::ListVerifiersResponse* response) override;

 private:
  class BatchCall;
  struct Batch;

  explicit Verifier(const VerifierConfig& config);
  absl::Status ValidateBatch(const tandem::v1::ScoreBatchRequest& request);
  // A worker thread: takes the next item of the next batch, round robin.
  void WorkerLoop();
  void ScoreItem(const std::shared_ptr<Batch>& batch, int index);
  // The caller cancelled or its deadline passed: drops the batch's waiting
  // items; its running ones see Batch::cancelled and stop.
  void CancelBatch(const std::shared_ptr<Batch>& batch);
  // Ends the call once no item of the batch runs or waits.
  void FinishBatch(Batch& batch);

  const VerifierConfig config_;
  std::shared_ptr<prometheus::Registry> registry_;
  VerifierMetrics metrics_;
  // Built once at Create; read-only afterwards, so shared without a lock.
  std::map<std::string, std::unique_ptr<Scorer>> scorers_;
  absl::Mutex mu_;
  // Batches with items not started yet, in turn order.
  std::deque<std::shared_ptr<Batch>> ready_ ABSL_GUARDED_BY(mu_);
  bool workers_stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> workers_;
  // tandem.v1.Environment, served beside the verifier on the same port;
  // declared before member_ so that it outlives the server.
  std::unique_ptr<EnvironmentService> environment_;
  std::unique_ptr<cluster::MemberDaemon> member_;
  // Items admitted and not finished.
  std::atomic<int64_t> inflight_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace tandem::verifier
