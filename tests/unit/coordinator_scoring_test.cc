#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "absl/synchronization/mutex.h"
#include "services/coordinator/scoring_dispatcher.h"

namespace tandem::coordinator {
namespace {

// Scores every item 1, except that addresses in `down` fail with
// UNAVAILABLE and items whose verifier is "bad" make the batch
// INVALID_ARGUMENT.
class FakeVerifiers : public VerifierClient {
 public:
  absl::StatusOr<tandem::v1::ScoreBatchResponse> ScoreBatch(
      const std::string& address, const tandem::v1::ScoreBatchRequest& request,
      absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    calls_[address].push_back(request.items_size());
    if (down_.count(address)) return absl::UnavailableError("down");
    tandem::v1::ScoreBatchResponse response;
    for (const auto& item : request.items()) {
      if (item.verifier() == "bad") {
        return absl::InvalidArgumentError("items[0].verifier: unknown");
      }
      auto* result = response.add_results();
      result->set_item_id(item.item_id());
      result->mutable_score()->set_reward(1.0);
      result->mutable_score()->set_outcome("correct");
    }
    return response;
  }
  absl::Mutex mu_;
  std::set<std::string> down_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<int>> calls_ ABSL_GUARDED_BY(mu_);
};

struct Sink {
  absl::Mutex mu;
  std::map<std::string, tandem::v1::Score> scores ABSL_GUARDED_BY(mu);
  void Add(const ScoringTask& task, const tandem::v1::Score& score) {
    absl::MutexLock lock(&mu);
    scores[task.item.item_id()] = score;
  }
  bool WaitFor(size_t n) {
    absl::MutexLock lock(&mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return scores.size() >= n;
    };
    return mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
  }
};

std::vector<ScoringTask> Tasks(int n, const std::string& verifier = "arith") {
  std::vector<ScoringTask> tasks;
  for (int i = 0; i < n; ++i) {
    ScoringTask task;
    task.group_id = "g";
    task.sample_index = i;
    task.item.set_item_id(verifier + std::to_string(i));
    task.item.set_verifier(verifier);
    tasks.push_back(task);
  }
  return tasks;
}

TEST_CASE(
    "Scoring: batches go round-robin to live verifiers, failed calls "
    "are retried elsewhere",
    "[coordinator][scoring]") {
  FakeVerifiers verifiers;
  {
    absl::MutexLock lock(&verifiers.mu_);
    verifiers.down_.insert("b:1");
  }
  Sink sink;
  ScoringDispatcherOptions options;
  options.batch_size = 4;
  options.batch_wait = absl::Milliseconds(20);
  options.retry_backoff = absl::Milliseconds(1);
  options.concurrency = 1;
  ScoringDispatcher dispatcher(
      options, &verifiers,
      [] {
        return std::vector<std::string>{"a:1", "b:1"};
      },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  dispatcher.Enqueue(Tasks(10));
  dispatcher.Start();
  REQUIRE(sink.WaitFor(10));
  dispatcher.Stop();
  absl::MutexLock lock(&verifiers.mu_);
  CHECK(!verifiers.calls_["b:1"].empty());
  int scored_items = 0;
  for (int n : verifiers.calls_["a:1"]) {
    CHECK(n <= 4);
    scored_items += n;
  }
  CHECK(scored_items == 10);
  ScoringStats stats = dispatcher.Stats();
  CHECK(stats.items_scored == 10);
  CHECK(stats.calls_failed >= 1);
  CHECK(stats.in_flight == 0);
}

TEST_CASE("Scoring: items wait while no verifier is registered",
          "[coordinator][scoring]") {
  FakeVerifiers verifiers;
  Sink sink;
  std::atomic<bool> registered{false};
  ScoringDispatcherOptions options;
  options.retry_backoff = absl::Milliseconds(5);
  ScoringDispatcher dispatcher(
      options, &verifiers,
      [&registered] {
        return registered ? std::vector<std::string>{"a:1"}
                          : std::vector<std::string>{};
      },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  dispatcher.Start();
  dispatcher.Enqueue(Tasks(3));
  absl::SleepFor(absl::Milliseconds(50));
  {
    absl::MutexLock lock(&sink.mu);
    CHECK(sink.scores.empty());
  }
  registered = true;
  CHECK(sink.WaitFor(3));
}

TEST_CASE(
    "Scoring: a malformed item is isolated and scored 0, the others "
    "are scored normally",
    "[coordinator][scoring]") {
  FakeVerifiers verifiers;
  Sink sink;
  ScoringDispatcherOptions options;
  options.batch_size = 8;
  options.batch_wait = absl::Milliseconds(20);
  ScoringDispatcher dispatcher(
      options, &verifiers, [] { return std::vector<std::string>{"a:1"}; },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  std::vector<ScoringTask> tasks = Tasks(3);
  for (auto& task : Tasks(1, "bad")) tasks.push_back(task);
  dispatcher.Enqueue(tasks);
  dispatcher.Start();
  REQUIRE(sink.WaitFor(4));
  absl::MutexLock lock(&sink.mu);
  CHECK(sink.scores["bad0"].outcome() == "invalid_request");
  CHECK(sink.scores["bad0"].reward() == 0.0);
  CHECK(sink.scores["arith1"].reward() == 1.0);
  CHECK(dispatcher.Stats().items_invalid == 1);
}

}  // namespace
}  // namespace tandem::coordinator
