#include <atomic>
#include <catch2/catch.hpp>
#include <memory>

#include "engine/engine.h"
#include "services/rollout/serving_queue.h"
#include "tests/unit/toy_engine_model.h"

namespace tandem::rollout {
namespace {

using engine::FinishReason;

constexpr int32_t kVocab = 32;

engine::EngineOptions Options() {
  engine::EngineOptions o;
  o.limits.max_num_seqs = 8;
  o.limits.max_batched_tokens = 64;
  o.num_kv_blocks = 256;
  o.block_size = 4;
  return o;
}

engine::SamplingParams Served(int32_t n, int32_t max_tokens) {
  engine::SamplingParams p;
  p.temperature = 0;
  p.n = n;
  p.max_tokens = max_tokens;
  p.report_tokens = true;
  return p;
}

// The worker's generation loop, reduced: admit, step, dispatch; returns
// the rollout samples (those not served).
std::vector<engine::FinishedSample> Loop(engine::Engine* e, ServingQueue* q,
                                         int steps) {
  std::vector<engine::FinishedSample> rollouts;
  for (int i = 0; i < steps; ++i) {
    q->AdmitTo(e);
    REQUIRE(e->Step().ok());
    q->Dispatch(e->TakeTokenEvents());
    for (auto& f : e->TakeFinished()) {
      if (!q->Dispatch(f)) rollouts.push_back(std::move(f));
    }
  }
  return rollouts;
}

TEST_CASE("served requests share the batch with rollouts and get every token") {
  engine::ToyModel model(kVocab);
  engine::Engine e(Options(), &model, &model, 0);
  ServingQueue q;
  std::atomic<int> notified{0};
  auto served =
      std::make_shared<ServedRequest>("oai-1", std::vector<int32_t>{1, 2, 3},
                                      Served(2, 6), [&] { ++notified; });
  REQUIRE(q.Submit(served).ok());
  engine::SamplingParams rollout;
  rollout.max_tokens = 6;
  REQUIRE(e.Add("lease-1", {4, 5, 6}, rollout).ok());
  model.Stage(7);  // a weight update lands while both run
  const auto rollouts = Loop(&e, &q, 20);
  REQUIRE(rollouts.size() == 1);
  CHECK(rollouts[0].request_id == "lease-1");
  const ServedRequest::Progress p = served->Take();
  REQUIRE(p.error.ok());
  CHECK(notified > 0);
  for (int i = 0; i < 2; ++i) {
    CHECK(p.tokens[i].size() == 6);
    CHECK(p.finished[i] == FinishReason::kLength);
    // The update was committed at the first step boundary: every token
    // was sampled under version 7.
    for (const ServedToken& t : p.tokens[i]) CHECK(t.policy_version == 7);
  }
  CHECK(q.num_admitted() == 0);
}

TEST_CASE("a cancelled sample ends aborted; its sibling runs to the end") {
  engine::ToyModel model(kVocab);
  engine::Engine e(Options(), &model, nullptr, 0);
  ServingQueue q;
  auto served = std::make_shared<ServedRequest>(
      "oai-2", std::vector<int32_t>{1, 2, 3}, Served(2, 30), [] {});
  REQUIRE(q.Submit(served).ok());
  Loop(&e, &q, 4);
  q.Cancel("oai-2", 0);
  Loop(&e, &q, 40);
  const ServedRequest::Progress p = served->Take();
  CHECK(p.finished[0] == FinishReason::kAborted);
  CHECK(p.tokens[0].size() < 30);
  CHECK(p.finished[1] == FinishReason::kLength);
  CHECK(p.tokens[1].size() == 30);
  CHECK(e.idle());
}

TEST_CASE("a request the engine refuses fails with the engine's message") {
  engine::ToyModel model(kVocab);
  engine::EngineOptions options = Options();
  options.num_kv_blocks = 2;
  engine::Engine e(options, &model, nullptr, 0);
  ServingQueue q;
  auto served = std::make_shared<ServedRequest>(
      "oai-3", std::vector<int32_t>{1, 2, 3}, Served(1, 50), [] {});
  REQUIRE(q.Submit(served).ok());
  Loop(&e, &q, 1);
  const absl::Status error = served->Take().error;
  CHECK(absl::IsInvalidArgument(error));
  CHECK(error.message().find("exceeds the whole KV cache") !=
        std::string::npos);
}

TEST_CASE("a request cancelled before admission never enters the engine") {
  engine::ToyModel model(kVocab);
  engine::Engine e(Options(), &model, nullptr, 0);
  ServingQueue q;
  auto served = std::make_shared<ServedRequest>(
      "oai-4", std::vector<int32_t>{1, 2}, Served(1, 5), [] {});
  REQUIRE(q.Submit(served).ok());
  q.Cancel("oai-4");
  Loop(&e, &q, 1);
  CHECK(absl::IsCancelled(served->Take().error));
  CHECK(e.idle());
}

TEST_CASE("shutdown fails queued and admitted requests and refuses new ones") {
  engine::ToyModel model(kVocab);
  engine::Engine e(Options(), &model, nullptr, 0);
  ServingQueue q;
  auto admitted = std::make_shared<ServedRequest>(
      "oai-5", std::vector<int32_t>{1, 2}, Served(1, 30), [] {});
  auto queued = std::make_shared<ServedRequest>(
      "oai-6", std::vector<int32_t>{1, 2}, Served(1, 30), [] {});
  REQUIRE(q.Submit(admitted).ok());
  Loop(&e, &q, 2);
  REQUIRE(q.Submit(queued).ok());
  q.Close(absl::UnavailableError("shutting down"));
  e.AbortAll();
  q.FailAdmitted(absl::UnavailableError("shutting down"));
  CHECK(absl::IsUnavailable(admitted->Take().error));
  CHECK(absl::IsUnavailable(queued->Take().error));
  CHECK(absl::IsUnavailable(q.Submit(queued)));
}

}  // namespace
}  // namespace tandem::rollout
