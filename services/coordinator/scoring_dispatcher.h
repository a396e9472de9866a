#pragma once

// ScoringDispatcher sends submitted samples to verifier replicas: it
// batches queued ScoringTasks (up to batch_size, waiting at most batch_wait
// for a batch to fill), calls ScoreBatch on the next live verifier in
// round-robin order with a deadline, and hands each score to a callback.
// Failed calls (unreachable, overloaded, timed out) put the items back at
// the front of the queue and are retried after a backoff on the next
// replica, for as long as it takes: a sample is never dropped for want of a
// verifier. A batch refused as malformed (INVALID_ARGUMENT) is retried item
// by item, and an item refused alone is scored 0 with outcome
// "invalid_request", so one bad sample cannot stall its group.
//
// Calls run on the dispatcher's own threads (scoring.concurrency of them),
// never on a gRPC reactor. Thread-safe; Stop() joins the threads.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/coordinator/group_ledger.h"
#include "tandem/v1/verifier.grpc.pb.h"

namespace tandem::coordinator {

// The seam to verifier replicas (a fake in unit tests).
class VerifierClient {
 public:
  virtual ~VerifierClient() = default;
  virtual absl::StatusOr<tandem::v1::ScoreBatchResponse> ScoreBatch(
      const std::string& address, const tandem::v1::ScoreBatchRequest& request,
      absl::Duration timeout) = 0;
};

// gRPC client with one channel per verifier address.
class GrpcVerifierClient : public VerifierClient {
 public:
  absl::StatusOr<tandem::v1::ScoreBatchResponse> ScoreBatch(
      const std::string& address, const tandem::v1::ScoreBatchRequest& request,
      absl::Duration timeout) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<tandem::v1::Verifier::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

struct ScoringDispatcherOptions {
  uint32_t batch_size = 64;
  absl::Duration batch_wait = absl::Milliseconds(5);
  absl::Duration timeout = absl::Seconds(10);
  uint32_t concurrency = 2;
  absl::Duration retry_backoff = absl::Milliseconds(100);
};

struct ScoringStats {
  uint64_t calls_ok = 0;
  uint64_t calls_failed = 0;
  uint64_t items_scored = 0;
  uint64_t items_invalid = 0;
  uint64_t queued = 0;
  uint64_t in_flight = 0;
};

class ScoringDispatcher {
 public:
  // Live verifier addresses (host:port), asked before every call.
  using AddressSource = std::function<std::vector<std::string>()>;
  // Called (on a dispatcher thread) once per scored task.
  using ScoreSink =
      std::function<void(const ScoringTask&, const tandem::v1::Score&)>;

  ScoringDispatcher(ScoringDispatcherOptions options, VerifierClient* client,
                    AddressSource addresses, ScoreSink sink);
  ~ScoringDispatcher();

  void Start();
  // Stops and joins the threads; queued tasks are discarded. Idempotent.
  void Stop();

  void Enqueue(std::vector<ScoringTask> tasks);
  ScoringStats Stats() const;

 private:
  struct Entry {
    ScoringTask task;
    // Send in a batch of its own (after a batch was refused as malformed).
    bool alone = false;
  };

  void Run();
  // Waits for work; false when stopping.
  bool TakeBatch(std::vector<Entry>* batch);
  void Requeue(std::vector<Entry> batch, bool alone);
  void SleepUnlessStopped(absl::Duration duration);

  const ScoringDispatcherOptions options_;
  VerifierClient* const client_;
  const AddressSource addresses_;
  const ScoreSink sink_;
  std::vector<std::thread> threads_;

  mutable absl::Mutex mu_;
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_replica_ ABSL_GUARDED_BY(mu_) = 0;
  ScoringStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::coordinator
