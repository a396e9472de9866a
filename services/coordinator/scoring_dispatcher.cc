#include "services/coordinator/scoring_dispatcher.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"

namespace tandem::coordinator {
namespace {

auto Log() { return ComponentLogger("coordinator"); }

}  // namespace

absl::StatusOr<tandem::v1::ScoreBatchResponse> GrpcVerifierClient::ScoreBatch(
    const std::string& address, const tandem::v1::ScoreBatchRequest& request,
    absl::Duration timeout) {
  tandem::v1::Verifier::Stub* stub;
  {
    absl::MutexLock lock(&mu_);
    auto& slot = stubs_[address];
    if (!slot) {
      slot = tandem::v1::Verifier::NewStub(rpc::MakeChannel(address, tls_));
    }
    stub = slot.get();
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  tandem::v1::ScoreBatchResponse response;
  grpc::Status status = stub->ScoreBatch(&context, request, &response);
  if (!status.ok()) return rpc::ToAbslStatus(status);
  return response;
}

ScoringDispatcher::ScoringDispatcher(ScoringDispatcherOptions options,
                                     VerifierClient* client,
                                     ReplicaSource replicas, ScoreSink sink)
    : options_(options),
      client_(client),
      replicas_(std::move(replicas)),
      sink_(std::move(sink)) {}

ScoringDispatcher::~ScoringDispatcher() { Stop(); }

void ScoringDispatcher::Start() {
  absl::MutexLock lock(&mu_);
  started_ = true;
  StartThreadsLocked();
}

void ScoringDispatcher::StartThreadsLocked() {
  if (!started_ || stop_) return;
  for (const auto& [name, queue] : queues_) {
    if (!threaded_.insert(name).second) continue;
    for (uint32_t i = 0; i < std::max<uint32_t>(options_.concurrency, 1);
         ++i) {
      threads_.emplace_back([this, name = name] { Run(name); });
    }
  }
}

void ScoringDispatcher::Stop() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    threads.swap(threads_);
  }
  for (auto& thread : threads) {
    if (thread.joinable()) thread.join();
  }
}

void ScoringDispatcher::Enqueue(std::vector<ScoringTask> tasks) {
  const absl::Time now = options_.clock->Now();
  absl::MutexLock lock(&mu_);
  bool takeable = false;
  for (auto& task : tasks) {
    VerifierQueue& queue = queues_[task.item.verifier()];
    queue.entries.push_back(Entry{std::move(task), false});
    takeable = takeable || queue.not_before <= now;
  }
  queued_ += tasks.size();
  // Threads waiting for a held queue need to wake only for work they can
  // take now (a held queue wakes them when its hold ends).
  if (takeable) ++enqueue_seq_;
  StartThreadsLocked();
}

ScoringStats ScoringDispatcher::Stats() const {
  absl::MutexLock lock(&mu_);
  ScoringStats stats = stats_;
  stats.queued = queued_;
  for (const auto& [name, queue] : queues_) {
    if (queue.unroutable_since != absl::InfiniteFuture()) {
      stats.unroutable_waiting += queue.entries.size();
    }
  }
  return stats;
}

bool ScoringDispatcher::TakeBatch(std::vector<Entry>* batch,
                                  const std::string& verifier) {
  absl::MutexLock lock(&mu_);
  // std::map: the queue stays where it is.
  VerifierQueue* queue = &queues_[verifier];
  bool waited_to_fill = false;
  while (true) {
    auto has_work = [this, queue]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || !queue->entries.empty();
    };
    mu_.Await(absl::Condition(&has_work));
    if (stop_) return false;
    const absl::Time now = options_.clock->Now();
    if (queue->not_before > now) {
      // Held back: sleep until the hold ends or new entries arrive.
      const uint64_t seen = enqueue_seq_;
      auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || enqueue_seq_ != seen;
      };
      options_.clock->AwaitWithDeadline(&mu_, absl::Condition(&changed),
                                        queue->not_before);
      continue;
    }
    std::deque<Entry>& entries = queue->entries;
    // Give a partial batch a moment to fill.
    if (!waited_to_fill && entries.size() < options_.batch_size &&
        !entries.front().alone && options_.batch_wait > absl::ZeroDuration()) {
      waited_to_fill = true;
      std::deque<Entry>* pending = &entries;
      const size_t want = options_.batch_size;
      auto full = [this, pending, want]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || pending->size() >= want || pending->empty();
      };
      options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&full),
                                       options_.batch_wait);
      continue;
    }
    if (entries.front().alone) {
      batch->push_back(std::move(entries.front()));
      entries.pop_front();
    } else {
      while (!entries.empty() && !entries.front().alone &&
             batch->size() < options_.batch_size) {
        batch->push_back(std::move(entries.front()));
        entries.pop_front();
      }
    }
    queued_ -= batch->size();
    stats_.in_flight += batch->size();
    return true;
  }
}

void ScoringDispatcher::Requeue(std::vector<Entry> batch, bool alone,
                                bool timed_out) {
  absl::MutexLock lock(&mu_);
  stats_.in_flight -= batch.size();
  queued_ += batch.size();
  ++enqueue_seq_;
  for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
    it->alone = it->alone || alone;
    it->timed_out = timed_out;
    queues_[it->task.item.verifier()].entries.push_front(std::move(*it));
  }
}

void ScoringDispatcher::ScoreZero(const std::vector<Entry>& batch,
                                  const std::string& outcome,
                                  const std::string& reason) {
  tandem::v1::Score score;
  score.set_reward(0.0);
  score.set_outcome(outcome);
  score.set_reason(reason);
  for (const Entry& entry : batch) sink_(entry.task, score);
  absl::MutexLock lock(&mu_);
  stats_.in_flight -= batch.size();
}

void ScoringDispatcher::HandleUnroutable(
    std::vector<Entry> batch, const std::string& verifier,
    const std::vector<VerifierReplica>& replicas) {
  const absl::Time now = options_.clock->Now();
  bool give_up = false;
  bool log = false;
  {
    absl::MutexLock lock(&mu_);
    VerifierQueue& queue = queues_[verifier];
    if (queue.unroutable_since == absl::InfiniteFuture()) {
      queue.unroutable_since = now;
    }
    stats_.unroutable_attempts += batch.size();
    give_up = options_.unroutable_timeout > absl::ZeroDuration() &&
              now - queue.unroutable_since >= options_.unroutable_timeout;
    if (now - queue.last_logged >= absl::Seconds(10)) {
      queue.last_logged = now;
      log = true;
    }
    if (!give_up) queue.not_before = now + options_.retry_backoff;
  }
  if (log) {
    std::set<std::string> served;
    for (const VerifierReplica& replica : replicas) {
      served.insert(replica.verifiers.begin(), replica.verifiers.end());
    }
    Log()->warn(
        "no live verifier replica serves verifier '{}' ({} live replicas "
        "serve: {}); its samples {}",
        verifier, replicas.size(),
        served.empty() ? "nothing" : absl::StrJoin(served, ", "),
        give_up ? "are scored 0 (no_verifier)" : "wait");
  }
  if (!give_up) {
    Requeue(std::move(batch), false);
    return;
  }
  ScoreZero(batch, "no_verifier",
            absl::StrCat("no live verifier replica serves '", verifier,
                         "' (waited ",
                         absl::FormatDuration(options_.unroutable_timeout),
                         ")"));
  absl::MutexLock lock(&mu_);
  stats_.items_no_verifier += batch.size();
}

void ScoringDispatcher::SleepUnlessStopped(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&stopping), duration);
}

void ScoringDispatcher::Run(const std::string& verifier) {
  while (true) {
    std::vector<Entry> batch;
    if (!TakeBatch(&batch, verifier)) return;
    if (batch.empty()) continue;
    std::vector<VerifierReplica> replicas = replicas_();
    std::vector<std::string> addresses;
    for (const VerifierReplica& replica : replicas) {
      if (replica.Serves(verifier)) addresses.push_back(replica.address);
    }
    if (addresses.empty()) {
      HandleUnroutable(std::move(batch), verifier, replicas);
      continue;
    }
    std::sort(addresses.begin(), addresses.end());
    std::string address;
    {
      absl::MutexLock lock(&mu_);
      VerifierQueue& queue = queues_[verifier];
      queue.unroutable_since = absl::InfiniteFuture();
      queue.last_logged = absl::InfinitePast();
      address = addresses[next_replica_[verifier]++ % addresses.size()];
    }
    tandem::v1::ScoreBatchRequest request;
    for (const Entry& entry : batch) *request.add_items() = entry.task.item;
    absl::StatusOr<tandem::v1::ScoreBatchResponse> response =
        client_->ScoreBatch(address, request, options_.timeout);
    if (response.ok() && response->results_size() != request.items_size()) {
      response = absl::InternalError(absl::StrCat(
          "verifier at ", address, " returned ", response->results_size(),
          " results for ", request.items_size(), " items"));
    }
    if (!response.ok()) {
      const bool malformed =
          response.status().code() == absl::StatusCode::kInvalidArgument;
      const bool timed_out =
          response.status().code() == absl::StatusCode::kDeadlineExceeded;
      // A batch over the verifier's max_batch_items can never be admitted
      // as it is (scoring.batch_size is larger): send its items alone.
      const bool too_large =
          response.status().code() == absl::StatusCode::kResourceExhausted &&
          absl::StrContains(response.status().message(), "max_batch_items");
      {
        absl::MutexLock lock(&mu_);
        ++stats_.calls_failed;
      }
      if (malformed && batch.size() == 1) {
        tandem::v1::Score score;
        score.set_reward(0.0);
        score.set_outcome("invalid_request");
        score.set_reason(std::string(response.status().message()));
        Log()->warn("verifier refused sample {}: {}",
                    batch[0].task.item.item_id(), response.status().ToString());
        sink_(batch[0].task, score);
        absl::MutexLock lock(&mu_);
        --stats_.in_flight;
        ++stats_.items_invalid;
        continue;
      }
      if (timed_out && batch.size() == 1 && batch[0].alone &&
          batch[0].timed_out) {
        Log()->warn(
            "verifier did not score sample {} within {}, twice (the second "
            "time alone at {}); scoring it 0 (timeout)",
            batch[0].task.item.item_id(),
            absl::FormatDuration(options_.timeout), address);
        ScoreZero(batch, "timeout",
                  absl::StrCat("the verifier did not score it within ",
                               absl::FormatDuration(options_.timeout),
                               " (scoring.timeout_ms), twice: ",
                               response.status().message()));
        absl::MutexLock lock(&mu_);
        ++stats_.items_timed_out;
        continue;
      }
      const bool split = malformed || timed_out || too_large;
      Log()->warn("ScoreBatch of {} items at {} failed: {}; retrying{}",
                  batch.size(), address, response.status().ToString(),
                  split ? " item by item" : "");
      // A batch that timed out is split: each item gets the whole timeout.
      Requeue(std::move(batch), split, timed_out);
      if (!malformed && !timed_out) SleepUnlessStopped(options_.retry_backoff);
      continue;
    }
    uint64_t non_finite = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const tandem::v1::Score& score = response->results(i).score();
      if (std::isfinite(score.reward())) {
        sink_(batch[i].task, score);
        continue;
      }
      // A NaN or infinite reward would make the group's advantages (and
      // so the loss) non-finite: the sample is scored 0 instead.
      ++non_finite;
      Log()->warn(
          "verifier '{}' at {} returned reward {} for sample {}; scoring it "
          "0 (non_finite_reward)",
          verifier, address, score.reward(), batch[i].task.item.item_id());
      tandem::v1::Score zero;
      zero.set_reward(0.0);
      zero.set_outcome("non_finite_reward");
      zero.set_reason(absl::StrCat("verifier '", verifier, "' at ", address,
                                   " returned reward ", score.reward(),
                                   " (outcome '", score.outcome(), "')"));
      sink_(batch[i].task, zero);
    }
    absl::MutexLock lock(&mu_);
    ++stats_.calls_ok;
    stats_.items_scored += batch.size() - non_finite;
    stats_.items_non_finite += non_finite;
    stats_.in_flight -= batch.size();
  }
}

}  // namespace tandem::coordinator
