#include "services/coordinator/scoring_dispatcher.h"

#include <algorithm>

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
    if (!slot) slot = tandem::v1::Verifier::NewStub(rpc::MakeChannel(address));
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
  for (uint32_t i = 0; i < std::max<uint32_t>(options_.concurrency, 1); ++i) {
    threads_.emplace_back([this] { Run(); });
  }
}

void ScoringDispatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (auto& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  threads_.clear();
}

void ScoringDispatcher::Enqueue(std::vector<ScoringTask> tasks) {
  const absl::Time now = absl::Now();
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
                                  std::string* verifier) {
  absl::MutexLock lock(&mu_);
  bool waited_to_fill = false;
  while (true) {
    auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || queued_ > 0;
    };
    mu_.Await(absl::Condition(&has_work));
    if (stop_) return false;
    // The next name after the one served last with entries that are not
    // held back, so that every verifier gets its turn.
    const absl::Time now = absl::Now();
    absl::Time earliest = absl::InfiniteFuture();
    VerifierQueue* chosen = nullptr;
    auto consider = [&](auto begin, auto end) {
      for (auto it = begin; it != end && chosen == nullptr; ++it) {
        if (it->second.entries.empty()) continue;
        if (it->second.not_before > now) {
          earliest = std::min(earliest, it->second.not_before);
          continue;
        }
        chosen = &it->second;
        *verifier = it->first;
      }
    };
    auto split = queues_.upper_bound(last_verifier_);
    consider(split, queues_.end());
    consider(queues_.begin(), split);
    if (chosen == nullptr) {
      // Every queued entry is held back: sleep until the first hold ends or
      // new entries arrive.
      const uint64_t seen = enqueue_seq_;
      auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || enqueue_seq_ != seen;
      };
      mu_.AwaitWithTimeout(absl::Condition(&changed), earliest - now);
      continue;
    }
    // Give a partial batch a moment to fill.
    if (!waited_to_fill && chosen->entries.size() < options_.batch_size &&
        !chosen->entries.front().alone &&
        options_.batch_wait > absl::ZeroDuration()) {
      waited_to_fill = true;
      std::deque<Entry>* entries = &chosen->entries;
      const size_t want = options_.batch_size;
      auto full = [this, entries, want]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || entries->size() >= want || entries->empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&full), options_.batch_wait);
      continue;
    }
    std::deque<Entry>& entries = chosen->entries;
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
    last_verifier_ = *verifier;
    queued_ -= batch->size();
    stats_.in_flight += batch->size();
    return true;
  }
}

void ScoringDispatcher::Requeue(std::vector<Entry> batch, bool alone) {
  absl::MutexLock lock(&mu_);
  stats_.in_flight -= batch.size();
  queued_ += batch.size();
  ++enqueue_seq_;
  for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
    it->alone = it->alone || alone;
    queues_[it->task.item.verifier()].entries.push_front(std::move(*it));
  }
}

void ScoringDispatcher::HandleUnroutable(
    std::vector<Entry> batch, const std::string& verifier,
    const std::vector<VerifierReplica>& replicas) {
  const absl::Time now = absl::Now();
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
  tandem::v1::Score score;
  score.set_reward(0.0);
  score.set_outcome("no_verifier");
  score.set_reason(absl::StrCat("no live verifier replica serves '", verifier,
                                "' (waited ",
                                absl::FormatDuration(options_.unroutable_timeout),
                                ")"));
  for (const Entry& entry : batch) sink_(entry.task, score);
  absl::MutexLock lock(&mu_);
  stats_.in_flight -= batch.size();
  stats_.items_no_verifier += batch.size();
}

void ScoringDispatcher::SleepUnlessStopped(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  mu_.AwaitWithTimeout(absl::Condition(&stopping), duration);
}

void ScoringDispatcher::Run() {
  while (true) {
    std::vector<Entry> batch;
    std::string verifier;
    if (!TakeBatch(&batch, &verifier)) return;
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
      Log()->warn("ScoreBatch of {} items at {} failed: {}; retrying",
                  batch.size(), address, response.status().ToString());
      Requeue(std::move(batch), malformed);
      if (!malformed) SleepUnlessStopped(options_.retry_backoff);
      continue;
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      sink_(batch[i].task, response->results(i).score());
    }
    absl::MutexLock lock(&mu_);
    ++stats_.calls_ok;
    stats_.items_scored += batch.size();
    stats_.in_flight -= batch.size();
  }
}

}  // namespace tandem::coordinator
