// The rollout worker's two coordinator-facing loops against a scripted
// coordinator (FakeCoordinatorClient): PromptPrefetcher keeps its queue at
// the target depth from the leases it is given, names the worker and its
// version, and gives back what it holds; SampleSubmitter loses only the
// bad sample of a call the coordinator refuses; a Backoff holds leasing
// for its whole length on the prefetcher's clock (a FakeClock here). The
// coordinator's own side of these RPCs is tested against the real
// coordinator (coordinator tests, rollout_worker_test, the integration
// tests).

#include <atomic>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "services/rollout/prompt_prefetcher.h"
#include "services/rollout/sample_submitter.h"
#include "tests/support/fake_clock.h"
#include "tests/support/fake_coordinator_client.h"
#include "tests/support/wait_for.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::rollout {
namespace {

using ::tandem::testing::WaitFor;

tandem::v1::Sample MakeSample(const std::string& lease_id, uint32_t index) {
  tandem::v1::Sample sample;
  sample.set_sample_id(absl::StrCat(lease_id, "/", index));
  sample.set_lease_id(lease_id);
  sample.set_group_id(absl::StrCat("g-", lease_id));
  sample.set_sample_index(index);
  sample.add_completion_token_ids(7);
  sample.add_behavior_logprobs(-0.5f);
  return sample;
}

TEST_CASE(
    "Sample submitter: a call refused for one bad sample is sent again one "
    "sample per call, so only the bad sample is lost",
    "[rollout][submitter]") {
  testing::FakeCoordinatorClient coordinator;
  absl::Mutex mu;
  std::vector<std::string> accepted;  // guarded by mu
  std::vector<std::string> members;   // guarded by mu
  // As the coordinator does: a call with any sample whose log-prob is not
  // finite is refused whole (INVALID_ARGUMENT), storing nothing.
  coordinator.on_submit_samples =
      [&](const tandem::v1::SubmitSamplesRequest& request,
          tandem::v1::SubmitSamplesResponse* response) {
        absl::MutexLock lock(&mu);
        members.push_back(request.member_id());
        for (const auto& sample : request.samples()) {
          for (float logprob : sample.behavior_logprobs()) {
            if (!std::isfinite(logprob)) {
              return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  sample.sample_id() + ": log-prob not finite");
            }
          }
        }
        for (const auto& sample : request.samples()) {
          accepted.push_back(sample.sample_id());
        }
        response->set_accepted(request.samples_size());
        return grpc::Status::OK;
      };
  prometheus::Registry registry;
  prometheus::Counter& refused =
      prometheus::BuildCounter().Name("refused").Register(registry).Add({});
  SampleSubmitter submitter(
      &coordinator, [] { return std::string("m-7"); }, /*max_batch=*/64,
      &refused);
  // One call of 4 samples (queued before Start): the second lease's second
  // sample has a NaN log-prob.
  for (const std::string lease : {"a", "b"}) {
    for (uint32_t i = 0; i < 2; ++i) {
      tandem::v1::Sample sample = MakeSample(lease, i);
      if (lease == "b" && i == 1) {
        sample.set_behavior_logprobs(0,
                                     std::numeric_limits<float>::quiet_NaN());
      }
      submitter.Enqueue(std::move(sample));
    }
  }
  submitter.Start();
  REQUIRE(submitter.Flush(absl::Seconds(20)));
  submitter.Stop();
  CHECK(submitter.submitted_total() == 3);
  CHECK(submitter.rejected_total() == 1);
  CHECK(submitter.refused_total() == 1);
  CHECK(submitter.split_total() == 1);
  CHECK(refused.Value() == 1);
  // The call of 4, then each sample alone: the good three delivered once,
  // in order, every call naming the worker.
  CHECK(coordinator.calls("SubmitSamples") == 5);
  absl::MutexLock lock(&mu);
  CHECK(accepted == std::vector<std::string>{"a/0", "a/1", "b/0"});
  CHECK(std::set<std::string>(members.begin(), members.end()) ==
        std::set<std::string>{"m-7"});
}

TEST_CASE(
    "Prompt prefetcher: fills its queue to the target depth with the worker's "
    "id and version, refills what the engine took, waits when told, and "
    "gives back what it holds",
    "[rollout][prefetcher]") {
  testing::FakeCoordinatorClient coordinator;
  absl::Mutex mu;
  int next_lease = 0;  // guarded by mu; 6 prompts in all
  std::vector<tandem::v1::LeasePromptsRequest> asked;  // guarded by mu
  std::vector<std::string> returned;                   // guarded by mu
  std::string return_reason;                           // guarded by mu
  coordinator.on_lease_prompts =
      [&](const tandem::v1::LeasePromptsRequest& request,
          tandem::v1::LeasePromptsResponse* response) {
        absl::MutexLock lock(&mu);
        asked.push_back(request);
        for (uint32_t i = 0; i < request.max_prompts() && next_lease < 6; ++i) {
          response->add_leases()->set_lease_id(absl::StrCat("l", next_lease++));
        }
        if (response->leases_size() == 0) response->set_retry_after_ms(10);
        return grpc::Status::OK;
      };
  coordinator.on_return_leases =
      [&](const tandem::v1::ReturnLeasesRequest& request,
          tandem::v1::ReturnLeasesResponse* response) {
        absl::MutexLock lock(&mu);
        returned.assign(request.lease_ids().begin(), request.lease_ids().end());
        return_reason = request.reason();
        response->set_returned(request.lease_ids_size());
        return grpc::Status::OK;
      };
  PromptPrefetcher prefetcher(
      &coordinator, [] { return std::string("m-3"); },
      [] { return uint64_t{42}; }, /*target_depth=*/4);
  prefetcher.Start();
  REQUIRE(WaitFor([&] { return prefetcher.depth() == 4; }, absl::Seconds(10)));
  {
    absl::MutexLock lock(&mu);
    REQUIRE(!asked.empty());
    CHECK(asked.front().member_id() == "m-3");
    CHECK(asked.front().policy_version() == 42);
    CHECK(asked.front().max_prompts() == 4);
  }
  const std::vector<tandem::v1::PromptLease> taken = prefetcher.Take(3);
  REQUIRE(taken.size() == 3);
  CHECK(taken[0].lease_id() == "l0");
  CHECK(taken[2].lease_id() == "l2");
  // It asks for the 3 it lacks; the coordinator has 2 left, then none (and
  // says to wait): the queue holds 3 and the prefetcher keeps asking.
  REQUIRE(WaitFor([&] { return prefetcher.depth() == 3; }, absl::Seconds(10)));
  REQUIRE(WaitFor(
      [&] {
        absl::MutexLock lock(&mu);
        return asked.size() >= 4;
      },
      absl::Seconds(10)));
  CHECK(prefetcher.leased_total() == 6);
  CHECK(prefetcher.ReturnQueued("test") == 3);
  CHECK(prefetcher.depth() == 0);
  prefetcher.Stop();
  absl::MutexLock lock(&mu);
  CHECK(asked[1].max_prompts() == 3);
  CHECK(returned == std::vector<std::string>{"l3", "l4", "l5"});
  CHECK(return_reason == "test");
}

TEST_CASE(
    "Prompt prefetcher: after Backoff it leases nothing until that much time "
    "has passed on its clock, then fills its queue",
    "[rollout][prefetcher]") {
  testing::FakeCoordinatorClient coordinator;
  std::atomic<int> calls{0};
  coordinator.on_lease_prompts =
      [&](const tandem::v1::LeasePromptsRequest& request,
          tandem::v1::LeasePromptsResponse* response) {
        const int call = calls.fetch_add(1);
        for (uint32_t i = 0; i < request.max_prompts(); ++i) {
          response->add_leases()->set_lease_id(absl::StrCat("l", call, ".", i));
        }
        return grpc::Status::OK;
      };
  testing::FakeClock clock;
  const absl::Time start = clock.Now();
  PromptPrefetcher prefetcher(
      &coordinator, [] { return std::string("m-1"); },
      [] { return uint64_t{1}; }, /*target_depth=*/2, &clock);
  prefetcher.Backoff(absl::Seconds(30));
  prefetcher.Start();
  // 29 s pass on the clock, a second at a time, each once the prefetcher
  // waits for it: still no lease call.
  for (int i = 0; i < 29; ++i) {
    REQUIRE(clock.WaitForWaiters(1));
    clock.Advance(absl::Seconds(1));
  }
  REQUIRE(clock.WaitForWaiters(1));
  CHECK(calls.load() == 0);
  CHECK(prefetcher.depth() == 0);
  // Past 30 s it leases up to its target depth.
  REQUIRE(testing::AdvanceUntil(clock, absl::Milliseconds(20),
                                [&] { return prefetcher.depth() == 2; }));
  CHECK(clock.Now() - start >= absl::Seconds(30));
  CHECK(calls.load() >= 1);
  prefetcher.Stop();
}

}  // namespace
}  // namespace tandem::rollout
