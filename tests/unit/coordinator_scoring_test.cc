#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "absl/synchronization/mutex.h"
#include "services/coordinator/member_registry.h"
#include "services/coordinator/scoring_dispatcher.h"
#include "tests/support/fake_clock.h"

namespace tandem::coordinator {
namespace {

// Scores every item 1, except that addresses in `down` fail with
// UNAVAILABLE, items whose verifier is "bad" make the batch
// INVALID_ARGUMENT, a batch of "slow" items blocks until `released_`, a
// batch with a "loop" item or of more than one "heavy" item times out
// (DEADLINE_EXCEEDED), and a batch of more than two "small" items is over
// max_batch_items (RESOURCE_EXHAUSTED). Items of "nan" and "inf" with an
// odd last digit get a NaN or +inf reward.
class FakeVerifiers : public VerifierClient {
 public:
  absl::StatusOr<tandem::v1::ScoreBatchResponse> ScoreBatch(
      const std::string& address, const tandem::v1::ScoreBatchRequest& request,
      absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    calls_[address].push_back(request.items_size());
    if (down_.count(address)) return absl::UnavailableError("down");
    if (request.items(0).verifier() == "slow") {
      ++slow_calls_;
      mu_.Await(absl::Condition(&released_));
    }
    if (request.items(0).verifier() == "small" && request.items_size() > 2) {
      return absl::ResourceExhaustedError(
          "batch of 3 items exceeds max_batch_items (2); send smaller "
          "batches");
    }
    for (const auto& item : request.items()) {
      if (item.verifier() == "loop" ||
          (item.verifier() == "heavy" && request.items_size() > 1)) {
        return absl::DeadlineExceededError("Deadline Exceeded");
      }
    }
    tandem::v1::ScoreBatchResponse response;
    for (const auto& item : request.items()) {
      if (item.verifier() == "bad") {
        return absl::InvalidArgumentError("items[0].verifier: unknown");
      }
      auto* result = response.add_results();
      result->set_item_id(item.item_id());
      result->mutable_score()->set_reward(1.0);
      result->mutable_score()->set_outcome("correct");
      if (item.verifier() == "nan" || item.verifier() == "inf") {
        // Every second item of these gets a non-finite reward.
        if (item.item_id().back() % 2 == 1) {
          result->mutable_score()->set_reward(
              item.verifier() == "nan"
                  ? std::numeric_limits<double>::quiet_NaN()
                  : std::numeric_limits<double>::infinity());
        }
      }
    }
    return response;
  }
  absl::Mutex mu_;
  std::set<std::string> down_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<int>> calls_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int slow_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Sink {
  absl::Mutex mu;
  std::map<std::string, tandem::v1::Score> scores ABSL_GUARDED_BY(mu);
  void Add(const ScoringTask& task, const tandem::v1::Score& score) {
    absl::MutexLock lock(&mu);
    scores[task.item.item_id()] = score;
  }
  bool WaitFor(size_t n, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return scores.size() >= n;
    };
    return mu.AwaitWithTimeout(absl::Condition(&done), timeout);
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
        return std::vector<VerifierReplica>{{"a:1", {}}, {"b:1", {}}};
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

TEST_CASE(
    "Scoring: calls that hang on a slow verifier hold only that verifier's "
    "threads; other verifiers' samples are scored meanwhile",
    "[coordinator][scoring]") {
  FakeVerifiers verifiers;
  Sink sink;
  ScoringDispatcherOptions options;
  options.batch_size = 2;
  options.batch_wait = absl::ZeroDuration();
  options.concurrency = 2;
  ScoringDispatcher dispatcher(
      options, &verifiers,
      [] { return std::vector<VerifierReplica>{{"a:1", {}}}; },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  dispatcher.Start();
  // More slow batches than the dispatcher has threads per verifier.
  dispatcher.Enqueue(Tasks(6, "slow"));
  {
    absl::MutexLock lock(&verifiers.mu_);
    auto both_busy = [&verifiers]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                         verifiers.mu_) { return verifiers.slow_calls_ == 2; };
    REQUIRE(verifiers.mu_.AwaitWithTimeout(absl::Condition(&both_busy),
                                           absl::Seconds(10)));
  }
  dispatcher.Enqueue(Tasks(3, "math"));
  // Scored while both slow calls still hang.
  REQUIRE(sink.WaitFor(3));
  {
    absl::MutexLock lock(&sink.mu);
    CHECK(sink.scores.count("math0") == 1);
    CHECK(sink.scores.count("slow0") == 0);
  }
  {
    absl::MutexLock lock(&verifiers.mu_);
    verifiers.released_ = true;
  }
  REQUIRE(sink.WaitFor(9));
  dispatcher.Stop();
  CHECK(dispatcher.Stats().in_flight == 0);
}

TEST_CASE(
    "Scoring: a batch that times out or is over the verifier's "
    "max_batch_items is retried item by item, and an item that times out "
    "again alone is scored 0 (timeout)",
    "[coordinator][scoring]") {
  FakeVerifiers verifiers;
  Sink sink;
  ScoringDispatcherOptions options;
  options.batch_size = 4;
  options.batch_wait = absl::Milliseconds(20);
  options.retry_backoff = absl::Milliseconds(1);
  options.concurrency = 1;
  ScoringDispatcher dispatcher(
      options, &verifiers,
      [] { return std::vector<VerifierReplica>{{"a:1", {}}}; },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  dispatcher.Enqueue(Tasks(3, "heavy"));
  dispatcher.Enqueue(Tasks(1, "loop"));
  dispatcher.Start();
  REQUIRE(sink.WaitFor(4));
  dispatcher.Enqueue(Tasks(3, "small"));
  REQUIRE(sink.WaitFor(7));
  dispatcher.Stop();
  absl::MutexLock lock(&sink.mu);
  for (const char* id : {"heavy0", "heavy1", "heavy2"}) {
    INFO(id);
    CHECK(sink.scores[id].reward() == 1.0);
  }
  const tandem::v1::Score& loop = sink.scores["loop0"];
  CHECK(loop.reward() == 0.0);
  CHECK(loop.outcome() == "timeout");
  CHECK(loop.reason().find("scoring.timeout_ms") != std::string::npos);
  const ScoringStats stats = dispatcher.Stats();
  CHECK(stats.items_timed_out == 1);
  CHECK(stats.items_scored == 6);
  CHECK(stats.in_flight == 0);
  for (const char* id : {"small0", "small1", "small2"}) {
    INFO(id);
    CHECK(sink.scores[id].reward() == 1.0);
  }
  absl::MutexLock verifiers_lock(&verifiers.mu_);
  // heavy: one batch of 3, then 3 alone; the loop twice alone (the two
  // verifiers' calls interleave); small: a batch of 3 refused, 3 alone.
  std::vector<int> calls = verifiers.calls_["a:1"];
  std::sort(calls.begin(), calls.end());
  CHECK(calls == std::vector<int>{1, 1, 1, 1, 1, 1, 1, 1, 3, 3});
}

TEST_CASE(
    "Scoring: a NaN or infinite reward from a verifier is never handed on; "
    "its sample is scored 0 (non_finite_reward) and counted",
    "[coordinator][scoring]") {
  FakeVerifiers verifiers;
  Sink sink;
  ScoringDispatcherOptions options;
  options.batch_size = 4;
  options.batch_wait = absl::Milliseconds(20);
  options.concurrency = 1;
  ScoringDispatcher dispatcher(
      options, &verifiers,
      [] { return std::vector<VerifierReplica>{{"a:1", {}}}; },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  dispatcher.Enqueue(Tasks(4, "nan"));
  dispatcher.Enqueue(Tasks(4, "inf"));
  dispatcher.Start();
  REQUIRE(sink.WaitFor(8));
  dispatcher.Stop();
  absl::MutexLock lock(&sink.mu);
  for (const auto& [id, score] : sink.scores) {
    INFO(id << " reward " << score.reward());
    CHECK(std::isfinite(score.reward()));
  }
  for (const char* id : {"nan0", "nan2", "inf0", "inf2"}) {
    INFO(id);
    CHECK(sink.scores[id].reward() == 1.0);
  }
  for (const char* id : {"nan1", "nan3", "inf1", "inf3"}) {
    INFO(id);
    CHECK(sink.scores[id].reward() == 0.0);
    CHECK(sink.scores[id].outcome() == "non_finite_reward");
  }
  CHECK(sink.scores["nan1"].reason().find("nan") != std::string::npos);
  CHECK(sink.scores["inf1"].reason().find("inf") != std::string::npos);
  CHECK(sink.scores["inf1"].reason().find("'inf' at a:1") != std::string::npos);
  const ScoringStats stats = dispatcher.Stats();
  CHECK(stats.items_non_finite == 4);
  CHECK(stats.items_scored == 4);
  CHECK(stats.in_flight == 0);
}

TEST_CASE("Scoring: items wait while no verifier is registered",
          "[coordinator][scoring]") {
  FakeVerifiers verifiers;
  Sink sink;
  std::atomic<bool> registered{false};
  testing::FakeClock clock;
  ScoringDispatcherOptions options;
  options.retry_backoff = absl::Milliseconds(5);
  options.clock = &clock;
  ScoringDispatcher dispatcher(
      options, &verifiers,
      [&registered] {
        return registered ? std::vector<VerifierReplica>{{"a:1", {}}}
                          : std::vector<VerifierReplica>{};
      },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  dispatcher.Start();
  dispatcher.Enqueue(Tasks(3));
  // 50 ms of retries (batch_wait and retry_backoff pass on the fake clock):
  // at least 5 attempts found no replica.
  CHECK(testing::AdvanceUntil(clock, absl::Milliseconds(5), [&] {
    return dispatcher.Stats().unroutable_attempts >= 5 * 3;
  }));
  {
    absl::MutexLock lock(&sink.mu);
    CHECK(sink.scores.empty());
  }
  registered = true;
  CHECK(testing::AdvanceUntil(clock, absl::Milliseconds(5), [&] {
    return sink.WaitFor(3, absl::ZeroDuration());
  }));
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
      options, &verifiers,
      [] { return std::vector<VerifierReplica>{{"a:1", {}}}; },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  std::vector<ScoringTask> tasks = Tasks(3);
  for (auto& task : Tasks(1, "bad")) tasks.push_back(task);
  dispatcher.Enqueue(tasks);
  dispatcher.Start();
  REQUIRE(sink.WaitFor(4));
  // Stats are updated right after the score is handed over.
  dispatcher.Stop();
  absl::MutexLock lock(&sink.mu);
  CHECK(sink.scores["bad0"].outcome() == "invalid_request");
  CHECK(sink.scores["bad0"].reward() == 0.0);
  CHECK(sink.scores["arith1"].reward() == 1.0);
  CHECK(dispatcher.Stats().items_invalid == 1);
}

TEST_CASE(
    "Scoring: a sample goes only to replicas that serve its verifier, "
    "load-balanced among them",
    "[coordinator][scoring]") {
  FakeVerifiers verifiers;
  Sink sink;
  ScoringDispatcherOptions options;
  options.batch_size = 2;
  options.batch_wait = absl::ZeroDuration();
  options.concurrency = 1;
  ScoringDispatcher dispatcher(
      options, &verifiers,
      [] {
        return std::vector<VerifierReplica>{
            {"math-a:1", {"math", "exact"}},
            {"math-b:1", {"math"}},
            {"code:1", {"code"}},
        };
      },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  std::vector<ScoringTask> tasks = Tasks(8, "math");
  for (auto& task : Tasks(4, "code")) tasks.push_back(task);
  for (auto& task : Tasks(2, "exact")) tasks.push_back(task);
  dispatcher.Enqueue(tasks);
  dispatcher.Start();
  REQUIRE(sink.WaitFor(14));
  dispatcher.Stop();
  absl::MutexLock lock(&verifiers.mu_);
  // Every batch holds one verifier name; record which names each replica
  // was sent by replaying the calls' sizes against what it may serve.
  auto items = [&](const std::string& address) {
    int n = 0;
    for (int k : verifiers.calls_[address]) n += k;
    return n;
  };
  CHECK(items("code:1") == 4);
  CHECK(items("math-a:1") + items("math-b:1") == 10);
  // math's 8 samples in batches of 2 alternate between its two replicas;
  // exact's 2 can only go to math-a.
  CHECK(items("math-b:1") >= 2);
  CHECK(items("math-a:1") >= 2 + 2);
  CHECK(dispatcher.Stats().unroutable_attempts == 0);
}

TEST_CASE(
    "Scoring: a verifier no replica serves waits, is counted and does not "
    "block other verifiers",
    "[coordinator][scoring]") {
  FakeVerifiers verifiers;
  Sink sink;
  std::atomic<bool> code_up{false};
  testing::FakeClock clock;
  ScoringDispatcherOptions options;
  options.batch_wait = absl::ZeroDuration();
  options.retry_backoff = absl::Milliseconds(5);
  options.concurrency = 1;
  options.clock = &clock;
  ScoringDispatcher dispatcher(
      options, &verifiers,
      [&code_up] {
        std::vector<VerifierReplica> replicas{{"math:1", {"math"}}};
        if (code_up) replicas.push_back({"code:1", {"code"}});
        return replicas;
      },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  std::vector<ScoringTask> tasks = Tasks(3, "code");
  for (auto& task : Tasks(3, "math")) tasks.push_back(task);
  dispatcher.Enqueue(tasks);
  dispatcher.Start();
  REQUIRE(sink.WaitFor(3));
  // 50 ms of retries on the fake clock: the code samples were tried (and
  // found no replica) again and again meanwhile.
  CHECK(testing::AdvanceUntil(clock, absl::Milliseconds(5), [&] {
    return dispatcher.Stats().unroutable_attempts >= 5 * 3;
  }));
  {
    absl::MutexLock lock(&sink.mu);
    CHECK(sink.scores.size() == 3);
    CHECK(sink.scores.count("math0") == 1);
    CHECK(sink.scores.count("code0") == 0);
  }
  ScoringStats waiting = dispatcher.Stats();
  CHECK(waiting.unroutable_attempts >= 3);
  CHECK(waiting.unroutable_waiting == 3);
  CHECK(waiting.items_no_verifier == 0);
  code_up = true;
  REQUIRE(testing::AdvanceUntil(clock, absl::Milliseconds(5), [&] {
    return sink.WaitFor(6, absl::ZeroDuration());
  }));
  dispatcher.Stop();
  CHECK(dispatcher.Stats().unroutable_waiting == 0);
  absl::MutexLock lock(&verifiers.mu_);
  CHECK(verifiers.calls_["code:1"].size() >= 1);
  CHECK(verifiers.calls_.count("math:1") == 1);
}

TEST_CASE(
    "Scoring: with unroutable_timeout a verifier nobody serves is scored 0 "
    "as no_verifier",
    "[coordinator][scoring]") {
  FakeVerifiers verifiers;
  Sink sink;
  ScoringDispatcherOptions options;
  options.batch_wait = absl::ZeroDuration();
  options.retry_backoff = absl::Milliseconds(5);
  options.unroutable_timeout = absl::Milliseconds(30);
  testing::FakeClock clock;
  options.clock = &clock;
  ScoringDispatcher dispatcher(
      options, &verifiers,
      [] { return std::vector<VerifierReplica>{{"math:1", {"math"}}}; },
      [&sink](const ScoringTask& t, const tandem::v1::Score& s) {
        sink.Add(t, s);
      });
  const absl::Time start = clock.Now();
  dispatcher.Enqueue(Tasks(2, "maht"));
  dispatcher.Start();
  // Retries every 5 ms on the fake clock until the timeout scores them.
  REQUIRE(testing::AdvanceUntil(clock, absl::Milliseconds(5), [&] {
    return dispatcher.Stats().items_no_verifier == 2;
  }));
  REQUIRE(sink.WaitFor(2));
  CHECK(clock.Now() - start >= absl::Milliseconds(30));
  dispatcher.Stop();
  absl::MutexLock lock(&sink.mu);
  CHECK(sink.scores["maht0"].outcome() == "no_verifier");
  CHECK(sink.scores["maht0"].reward() == 0.0);
  CHECK(sink.scores["maht0"].reason().find("maht") != std::string::npos);
  CHECK(dispatcher.Stats().items_no_verifier == 2);
  absl::MutexLock verifiers_lock(&verifiers.mu_);
  CHECK(verifiers.calls_.empty());
}

TEST_CASE(
    "Scoring: the registry reports the verifier names each alive replica "
    "advertised",
    "[coordinator][scoring]") {
  MemberRegistry registry(absl::Seconds(5), "");
  const absl::Time now = absl::Now();
  tandem::v1::RegisterRequest request;
  request.set_role(tandem::v1::ROLE_VERIFIER);
  request.set_grpc_address("v1:1");
  (*request.mutable_capabilities())["verifiers"] = "math, code,,exact";
  registry.Register(request, now);
  request.set_grpc_address("v2:1");
  request.mutable_capabilities()->clear();
  const std::string draining =
      registry.Register(request, now).member_id();
  request.set_grpc_address("v3:1");
  registry.Register(request, now);
  tandem::v1::HeartbeatRequest heartbeat;
  heartbeat.set_member_id(draining);
  heartbeat.set_state(tandem::v1::MEMBER_STATE_DRAINING);
  REQUIRE(registry.Heartbeat(heartbeat, now).ok());
  std::vector<MemberRegistry::ServingVerifier> serving =
      registry.ServingVerifiers();
  REQUIRE(serving.size() == 2);
  std::map<std::string, std::set<std::string>> by_address;
  for (const auto& s : serving) by_address[s.address] = s.verifiers;
  CHECK(by_address["v1:1"] == std::set<std::string>{"code", "exact", "math"});
  CHECK(by_address["v3:1"].empty());  // advertised nothing: serves any
  CHECK(by_address.count("v2:1") == 0);  // draining takes no new work
}

}  // namespace
}  // namespace tandem::coordinator
