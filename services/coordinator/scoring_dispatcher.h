#pragma once

// ScoringDispatcher sends submitted samples to verifier replicas: it
// batches queued ScoringTasks that name the same verifier (up to
// batch_size, waiting at most batch_wait for a batch to fill), calls
// ScoreBatch with a deadline on the next live replica, in round-robin order,
// among those that serve that verifier, and hands each score to a callback.
//
// Routing: a replica advertises the verifier names it serves when it
// registers (capability "verifiers", a comma list). A replica that
// advertised no list is assumed to serve every name. A sample whose
// verifier no live replica serves is "unroutable": it is set aside (other
// verifiers' samples keep flowing), counted, logged with the names the live
// replicas do serve, and tried again after retry_backoff. With
// unroutable_timeout > 0 it is scored 0 with outcome "no_verifier" once it
// has waited that long, so a dataset naming a verifier nobody runs cannot
// stall its groups forever; with 0 it waits until such a replica registers.
//
// Failed calls (unreachable, overloaded) put the items back at the front of
// the queue and are retried after a backoff on the next replica, for as
// long as it takes: a sample is never dropped for want of a live replica.
// A batch refused as malformed (INVALID_ARGUMENT) is retried item by item,
// and an item refused alone is scored 0 with outcome "invalid_request", so
// one bad sample cannot stall its group. A batch that times out
// (DEADLINE_EXCEEDED after `timeout`; the verifier stops its work then) is
// retried item by item too, and an item that times out again alone is
// scored 0 with outcome "timeout", so a sample its verifier cannot score
// within `timeout` cannot stall its group either. A batch refused for
// exceeding the replica's max_batch_items (RESOURCE_EXHAUSTED naming it;
// batch_size is set larger) is retried item by item as well. A reward that
// is not finite (NaN, +-inf: a verifier bug) never reaches its group: the
// sample is scored 0 with outcome "non_finite_reward", counted and logged
// with the verifier, its address and the value.
//
// Calls run on the dispatcher's own threads, never on a gRPC reactor: each
// verifier name has `concurrency` threads of its own (started when the name
// is first queued), so calls of a slow verifier (e.g. code full of infinite
// loops) hold only its own threads and delay only the groups it scores;
// other names' batches keep flowing. Thread-safe; Stop() joins the threads.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/rpc/tls_options.h"
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
  // `tls` secures every channel to a verifier (the coordinator's own).
  explicit GrpcVerifierClient(rpc::TlsOptions tls = {})
      : tls_(std::move(tls)) {}
  absl::StatusOr<tandem::v1::ScoreBatchResponse> ScoreBatch(
      const std::string& address, const tandem::v1::ScoreBatchRequest& request,
      absl::Duration timeout) override;

 private:
  const rpc::TlsOptions tls_;
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
  // How long an unroutable sample waits for a replica serving its verifier
  // before it is scored 0 ("no_verifier"); zero waits forever.
  absl::Duration unroutable_timeout = absl::ZeroDuration();
  // Times batch_wait, retry_backoff and unroutable_timeout (not the gRPC
  // deadline of a call, which is real time). Outlives the dispatcher.
  Clock* clock = RealClock();
};

// A live verifier replica and the verifier names it serves.
struct VerifierReplica {
  std::string address;  // host:port
  // Empty: the replica advertised nothing and is assumed to serve any name.
  std::set<std::string> verifiers;

  bool Serves(const std::string& verifier) const {
    return verifiers.empty() || verifiers.count(verifier) > 0;
  }
};

struct ScoringStats {
  uint64_t calls_ok = 0;
  uint64_t calls_failed = 0;
  uint64_t items_scored = 0;
  uint64_t items_invalid = 0;
  uint64_t queued = 0;
  uint64_t in_flight = 0;
  // Times a sample found no live replica serving its verifier (counted per
  // sample per attempt).
  uint64_t unroutable_attempts = 0;
  // Samples waiting now because no live replica serves their verifier.
  uint64_t unroutable_waiting = 0;
  // Samples scored 0 ("no_verifier") after unroutable_timeout.
  uint64_t items_no_verifier = 0;
  // Samples scored 0 ("timeout") after their call timed out twice, the
  // second time alone.
  uint64_t items_timed_out = 0;
  // Samples scored 0 ("non_finite_reward") because their verifier returned
  // a NaN or infinite reward (not counted in items_scored).
  uint64_t items_non_finite = 0;
};

class ScoringDispatcher {
 public:
  // Live verifier replicas, asked before every call.
  using ReplicaSource = std::function<std::vector<VerifierReplica>()>;
  // Called (on a dispatcher thread) once per scored task.
  using ScoreSink =
      std::function<void(const ScoringTask&, const tandem::v1::Score&)>;

  ScoringDispatcher(ScoringDispatcherOptions options, VerifierClient* client,
                    ReplicaSource replicas, ScoreSink sink);
  ~ScoringDispatcher();

  void Start();
  // Stops and joins the threads; queued tasks are discarded. Idempotent.
  void Stop();

  void Enqueue(std::vector<ScoringTask> tasks);
  ScoringStats Stats() const;

 private:
  struct Entry {
    ScoringTask task;
    // Send in a batch of its own (after a batch was refused as malformed
    // or timed out).
    bool alone = false;
    // Its last call timed out.
    bool timed_out = false;
  };
  // The queue of one verifier name.
  struct VerifierQueue {
    std::deque<Entry> entries;
    // Not taken before this time (set while no replica serves the name).
    absl::Time not_before = absl::InfinitePast();
    // Since when no live replica has served the name (InfiniteFuture while
    // one does).
    absl::Time unroutable_since = absl::InfiniteFuture();
    absl::Time last_logged = absl::InfinitePast();
  };

  // The calling threads of one verifier name.
  void Run(const std::string& verifier);
  // Starts the threads of names that have none yet.
  void StartThreadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for work of `verifier`; false when stopping.
  bool TakeBatch(std::vector<Entry>* batch, const std::string& verifier);
  void Requeue(std::vector<Entry> batch, bool alone, bool timed_out = false);
  // Scores a batch 0 with `outcome` and `reason` without calling anyone.
  void ScoreZero(const std::vector<Entry>& batch, const std::string& outcome,
                 const std::string& reason);
  // Puts back a batch no live replica serves and holds its verifier's queue
  // for retry_backoff, or scores the batch 0 ("no_verifier") once the name
  // has been unroutable for unroutable_timeout.
  void HandleUnroutable(std::vector<Entry> batch, const std::string& verifier,
                        const std::vector<VerifierReplica>& replicas);
  void SleepUnlessStopped(absl::Duration duration);

  const ScoringDispatcherOptions options_;
  VerifierClient* const client_;
  const ReplicaSource replicas_;
  const ScoreSink sink_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // Verifier names whose threads run.
  std::set<std::string> threaded_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, VerifierQueue> queues_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped when entries that can be taken now are added, to wake threads
  // waiting for a held queue.
  uint64_t enqueue_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Round-robin position per verifier name.
  std::map<std::string, uint64_t> next_replica_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  ScoringStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::coordinator
