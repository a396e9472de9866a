// The rollout worker's `update_mode: inplace` (InplaceWeightSource): the
// model's live tensors are views of the one flat buffer that transports
// receive into (no second copy), a version received into it while the
// engine is parked becomes live bit for bit with a version bump, a version
// that fails verification is never generated with (the engine stays parked
// until a verified version is committed), and a writer waits at most for
// the step under way, with no step running while it writes.

#include <torch/torch.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/weights/model_flattening.h"
#include "engine/engine.h"
#include "engine/torch_engine_model.h"
#include "services/rollout/weight_update_sources.h"
#include "tests/support/wait_for.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::rollout {
namespace {

// Waits (real time, at most 10 s) until the engine thread waits parked in
// `source`'s Commit().
bool WaitParked(const InplaceWeightSource& source) {
  return testing::WaitFor([&] { return source.ParkedForTest(); },
                          absl::Seconds(10));
}

std::shared_ptr<model::ModelWeights> Weights(uint64_t seed,
                                             model::WeightDType dtype) {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  config.dtype = dtype;
  // Larger than the default init, so that two versions' log-probs differ
  // clearly (model_test's kTestInit).
  auto w = model::RandomInit(config, seed, {.stddev = 0.15, .norm_noise = 0.2});
  REQUIRE(w.ok());
  return *w;
}

// Log-probs of `output` after `prompt` under `weights` (one packed forward).
std::vector<float> FullForwardLogProbs(
    std::shared_ptr<model::ModelWeights> weights,
    const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), output.begin(), output.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  model::DecoderModel model(std::move(weights));
  auto logits = model.ForwardPacked(
      torch::tensor(ids, torch::kLong), torch::arange(n, torch::kLong),
      torch::tensor(std::vector<int64_t>{0, n}, torch::kLong));
  REQUIRE(logits.ok());
  const auto logprobs = torch::log_softmax(logits->to(torch::kFloat), -1);
  std::vector<float> out;
  for (size_t t = 0; t < output.size(); ++t) {
    const int64_t row = static_cast<int64_t>(prompt.size() + t) - 1;
    out.push_back(logprobs[row][output[t]].item<float>());
  }
  return out;
}

// Receives `weights` as version `version` into `staging` the way a
// transport does: Begin (which parks the engine), every bucket written and
// verified, Commit (which releases it). `corrupt_bucket` >= 0 flips one
// byte of that bucket on the wire. Returns the first error.
absl::Status Receive(weights::StagingWeights* staging,
                     const model::ModelWeights& weights, uint64_t version,
                     int corrupt_bucket = -1) {
  const weights::FlatWeightLayout& layout = staging->layout();
  auto flat = weights::FlattenModel(weights, layout);
  REQUIRE(flat.ok());
  auto manifest = layout.BuildManifest(absl::MakeConstSpan(**flat), version);
  REQUIRE(manifest.ok());
  if (absl::Status s = staging->Begin(*manifest); !s.ok()) return s;
  for (const weights::BucketRange& b : layout.buckets()) {
    std::vector<uint8_t> bytes((*flat)->begin() + b.offset,
                               (*flat)->begin() + b.offset + b.size);
    if (static_cast<int>(b.index) == corrupt_bucket) bytes[b.size / 2] ^= 0x40;
    if (absl::Status s = staging->WriteBucketChunk(b.index, 0, bytes);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = staging->FinishBucket(b.index); !s.ok()) return s;
  }
  return staging->Commit().status();
}

engine::EngineOptions Options() {
  engine::EngineOptions options;
  options.limits.max_num_seqs = 4;
  options.limits.max_batched_tokens = 64;
  options.num_kv_blocks = 256;
  options.block_size = 16;
  return options;
}

// Every tensor of the live weights is a view of `staging`'s one buffer at
// its layout offset.
void CheckViewsOfBuffer(const model::ModelWeights& live,
                        weights::StagingWeights* staging) {
  const absl::Span<uint8_t> buffer = staging->inplace_buffer();
  REQUIRE(!buffer.empty());
  uint64_t viewed = 0;
  for (const auto& [name, tensor] : live.tensors()) {
    INFO(name);
    const weights::TensorPlacement* p = staging->layout().Find(name);
    REQUIRE(p != nullptr);
    CHECK(tensor.data_ptr() == buffer.data() + p->offset);
    CHECK(tensor.is_contiguous());
    CHECK(static_cast<uint64_t>(tensor.storage().nbytes()) ==
          p->info.byte_size);
    viewed += p->info.byte_size;
  }
  // Nothing else: the weight bytes held are the buffer's.
  CHECK(viewed <= buffer.size());
  CHECK(static_cast<uint64_t>(live.num_bytes()) == viewed);
}

TEST_CASE(
    "inplace update: live tensors view the one flat buffer; a version "
    "received into it becomes live bit for bit, the version bumps and "
    "generation follows the new weights") {
  const model::WeightDType dtype =
      GENERATE(model::WeightDType::kFloat32, model::WeightDType::kBFloat16);
  INFO("dtype " << model::WeightDTypeName(dtype));
  auto decoder = std::make_shared<model::DecoderModel>(Weights(1, dtype));
  auto source = InplaceWeightSource::Create(decoder, 0);
  REQUIRE(source.ok());
  weights::StagingWeights* staging = (*source)->staging().get();
  const model::ModelWeights* live = decoder->weights().get();
  CheckViewsOfBuffer(*live, staging);
  const auto initial = Weights(1, dtype);
  for (const auto& [name, tensor] : initial->tensors()) {
    INFO(name);
    CHECK(torch::equal(live->tensors().at(name), tensor));
  }

  engine::TorchEngineModel engine_model(decoder, 256);
  engine::EngineOptions options = Options();
  options.kv_policy = engine::EngineOptions::KvPolicy::kRecompute;
  engine::Engine engine(options, &engine_model, source->get(), 0);
  engine::SamplingParams params;
  params.seed = 5;
  params.max_tokens = 10;
  const std::vector<int32_t> prompt = {9, 14, 27, 3, 60, 41};
  REQUIRE(engine.Add("a", prompt, params).ok());
  for (int i = 0; i < 4; ++i) REQUIRE(engine.Step().ok());
  CHECK(engine.policy_version() == 0);

  // The engine is between steps: the receiver writes at once.
  const auto next = Weights(2, dtype);
  REQUIRE(Receive(staging, *next, 1).ok());
  CHECK((*source)->ReadyVersion(0) == 1);
  bool committed = false;
  std::map<std::string, engine::FinishedSample> done;
  for (int i = 0; i < 1000 && !engine.idle(); ++i) {
    auto step = engine.Step();
    REQUIRE(step.ok());
    if (step->committed_update) {
      CHECK(step->committed_version == 1);
      committed = true;
    }
    for (auto& f : engine.TakeFinished()) done[f.request_id] = f;
  }
  REQUIRE(committed);
  CHECK(engine.policy_version() == 1);
  CHECK((*source)->ReadyVersion(1) == 0);
  (*source)->StepDone();  // the probe above counts as a step boundary

  // Same ModelWeights object, still views of the buffer, values of the new
  // version.
  REQUIRE(decoder->weights().get() == live);
  CheckViewsOfBuffer(*live, staging);
  for (const auto& [name, tensor] : live->tensors()) {
    INFO(name);
    CHECK(tensor.dtype() == next->tensors().at(name).dtype());
    CHECK(torch::equal(tensor, next->tensors().at(name)));
  }

  // Tokens 0-3 came from version 0, the rest from version 1, and each
  // log-prob is its version's.
  const engine::FinishedSample& s = done.at("a");
  REQUIRE(s.output.size() == 10);
  REQUIRE(s.spans.size() == 2);
  CHECK(s.spans[0].policy_version == 0);
  CHECK(s.spans[0].num_tokens == 4);
  CHECK(s.spans[1].policy_version == 1);
  CHECK(s.spans[1].num_tokens == 6);
  const auto old_lp = FullForwardLogProbs(Weights(1, dtype), prompt, s.output);
  const auto new_lp = FullForwardLogProbs(next, prompt, s.output);
  // The cached decode and the full forward round bf16 intermediates
  // differently (model_test: "cached decode equals the full forward in bf16
  // within 0.25").
  const double margin = dtype == model::WeightDType::kFloat32 ? 1e-4 : 0.25;
  double to_new = 0, to_old = 0;
  for (size_t t = 0; t < s.output.size(); ++t) {
    INFO("token " << t);
    const float expected = t < 4 ? old_lp[t] : new_lp[t];
    CHECK(s.logprobs[t] == Approx(expected).margin(margin));
    if (t >= 4) {
      to_new += std::abs(s.logprobs[t] - new_lp[t]);
      to_old += std::abs(s.logprobs[t] - old_lp[t]);
    }
  }
  INFO("after the update: |lp - new| " << to_new << ", |lp - old| " << to_old);
  CHECK(to_new < 0.25 * to_old);

  // A request that starts after the update generates under the new weights.
  REQUIRE(engine.Add("b", prompt, params).ok());
  std::map<std::string, engine::FinishedSample> after;
  for (int i = 0; i < 1000 && !engine.idle(); ++i) {
    REQUIRE(engine.Step().ok());
    for (auto& f : engine.TakeFinished()) after[f.request_id] = f;
  }
  const engine::FinishedSample& b = after.at("b");
  REQUIRE(b.spans.size() == 1);
  CHECK(b.spans[0].policy_version == 1);
  const auto b_lp = FullForwardLogProbs(next, prompt, b.output);
  for (size_t t = 0; t < b.output.size(); ++t) {
    INFO("token " << t);
    CHECK(b.logprobs[t] == Approx(b_lp[t]).margin(margin));
  }
}

TEST_CASE(
    "inplace update: a version with a corrupted bucket is never "
    "generated with; the engine stays parked until a verified version "
    "is committed, then continues with it") {
  const model::WeightDType dtype = model::WeightDType::kFloat32;
  auto decoder = std::make_shared<model::DecoderModel>(Weights(1, dtype));
  // Small buckets, so that the corrupted one is one of several.
  auto source =
      InplaceWeightSource::Create(decoder, 0, {.bucket_bytes = 64 << 10});
  REQUIRE(source.ok());
  weights::StagingWeights* staging = (*source)->staging().get();
  REQUIRE(staging->layout().num_buckets() >= 3);
  engine::TorchEngineModel engine_model(decoder, 256);
  engine::Engine engine(Options(), &engine_model, source->get(), 0);
  engine::SamplingParams params;
  params.seed = 11;
  params.max_tokens = 12;
  const std::vector<int32_t> prompt = {4, 8, 15, 16, 23, 42};
  REQUIRE(engine.Add("a", prompt, params).ok());
  for (int i = 0; i < 3; ++i) REQUIRE(engine.Step().ok());

  const absl::Status bad =
      Receive(staging, *Weights(2, dtype), 1, /*corrupt_bucket=*/1);
  INFO(bad.ToString());
  REQUIRE(bad.code() == absl::StatusCode::kDataLoss);
  CHECK(staging->live_lost());
  CHECK(!staging->live_version().has_value());
  CHECK(staging->stats().rejected_versions == 1);
  CHECK((*source)->stats().invalidations == 1);
  CHECK((*source)->ReadyVersion(0) != 0);

  // The next step parks at its boundary and stays parked: no token, no
  // forward pass with the half-written weights.
  std::atomic<bool> returned{false};
  absl::StatusOr<engine::StepStats> parked_step;
  std::thread engine_thread([&] {
    parked_step = engine.Step();
    returned = true;
  });
  REQUIRE(WaitParked(**source));
  const absl::Time parked = absl::Now();
  CHECK(!returned);

  // A verified full version (the latest, v2) is received: the engine
  // resumes with it; v1 is never live.
  const auto good = Weights(3, dtype);
  const absl::Time received = absl::Now();
  REQUIRE(Receive(staging, *good, 2).ok());
  engine_thread.join();
  REQUIRE(parked_step.ok());
  CHECK(parked_step->committed_update);
  CHECK(parked_step->committed_version == 2);
  // The step's pause (a duration for a metric, real time by the clock
  // rule) covers the time it was seen parked.
  CHECK(parked_step->pause_seconds >=
        absl::ToDoubleSeconds(received - parked));
  CHECK(engine.policy_version() == 2);
  CHECK(!staging->live_lost());

  std::map<std::string, engine::FinishedSample> done;
  for (auto& f : engine.TakeFinished()) done[f.request_id] = f;
  for (int i = 0; i < 1000 && !engine.idle(); ++i) {
    REQUIRE(engine.Step().ok());
    for (auto& f : engine.TakeFinished()) done[f.request_id] = f;
  }
  const engine::FinishedSample& s = done.at("a");
  REQUIRE(s.spans.size() == 2);
  CHECK(s.spans[0].policy_version == 0);
  CHECK(s.spans[0].num_tokens == 3);
  CHECK(s.spans[1].policy_version == 2);
  // The live weights are v2's bytes, and a request started now follows
  // v2's forward exactly.
  for (const auto& [name, tensor] : decoder->weights()->tensors()) {
    INFO(name);
    CHECK(torch::equal(tensor, good->tensors().at(name)));
  }
  REQUIRE(engine.Add("b", prompt, params).ok());
  for (int i = 0; i < 1000 && !engine.idle(); ++i) {
    REQUIRE(engine.Step().ok());
    for (auto& f : engine.TakeFinished()) done[f.request_id] = f;
  }
  const engine::FinishedSample& b = done.at("b");
  REQUIRE(b.spans.size() == 1);
  CHECK(b.spans[0].policy_version == 2);
  const auto b_lp = FullForwardLogProbs(good, prompt, b.output);
  for (size_t t = 0; t < b.output.size(); ++t) {
    INFO("token " << t);
    CHECK(b.logprobs[t] == Approx(b_lp[t]).margin(1e-4));
  }
}

// Counts forward passes begun and ended around the real model.
class CountingModel : public engine::EngineModel {
 public:
  explicit CountingModel(engine::EngineModel* inner) : inner_(inner) {}
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  absl::StatusOr<std::vector<float>> Forward(
      const std::vector<engine::ForwardChunk>& chunks) override {
    ++begun;
    auto out = inner_->Forward(chunks);
    ++ended;
    return out;
  }
  bool ForkCache(uint64_t src, uint64_t dst, int32_t n) override {
    return inner_->ForkCache(src, dst, n);
  }
  void ReleaseCache(uint64_t id) override { inner_->ReleaseCache(id); }

  std::atomic<int64_t> begun{0}, ended{0};

 private:
  engine::EngineModel* const inner_;
};

TEST_CASE(
    "inplace update: the writer waits at most for the forward pass "
    "under way, and no forward pass runs while it writes") {
  const model::WeightDType dtype = model::WeightDType::kFloat32;
  auto decoder = std::make_shared<model::DecoderModel>(Weights(1, dtype));
  auto source = InplaceWeightSource::Create(decoder, 0);
  REQUIRE(source.ok());
  weights::StagingWeights* staging = (*source)->staging().get();
  engine::TorchEngineModel torch_model(decoder, 256);
  CountingModel counting(&torch_model);
  engine::Engine engine(Options(), &counting, source->get(), 0);
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> last_version{0};
  // Catch2 assertions are not thread-safe: the engine thread sets `failed`.
  std::thread engine_thread([&] {
    int request = 0;
    while (!stop && !failed) {
      if (engine.idle()) {
        engine::SamplingParams params;
        params.seed = 1 + request;
        params.max_tokens = 40;
        params.n = 4;
        if (!engine
                 .Add(std::to_string(request++), {5, 6, 7, 8, 9, 10, 11},
                      params)
                 .ok()) {
          failed = true;
        }
      }
      if (!engine.Step().ok()) failed = true;
      last_version = engine.policy_version();
      engine.TakeFinished();
    }
  });
  for (uint64_t v = 1; v <= 5; ++v) {
    INFO("version " << v);
    REQUIRE(testing::WaitFor(
        [&] {
          return failed || counting.ended >= static_cast<int64_t>(10 * v);
        },
        absl::Seconds(60)));
    REQUIRE(!failed);
    const auto next = Weights(10 + v, dtype);
    const auto flat = weights::FlattenModel(*next, staging->layout());
    REQUIRE(flat.ok());
    auto manifest =
        staging->layout().BuildManifest(absl::MakeConstSpan(**flat), v);
    REQUIRE(manifest.ok());
    const int64_t begun_before = counting.begun;
    REQUIRE(staging->Begin(*manifest).ok());  // parks the engine
    // At most the step that had already passed its boundary ran a forward.
    const int64_t begun_parked = counting.begun;
    CHECK(begun_parked <= begun_before + 1);
    CHECK(counting.ended == begun_parked);
    for (const weights::BucketRange& b : staging->layout().buckets()) {
      REQUIRE(staging
                  ->WriteBucketChunk(
                      b.index, 0,
                      absl::MakeConstSpan(**flat).subspan(b.offset, b.size))
                  .ok());
      absl::SleepFor(absl::Milliseconds(20));  // a slow transfer
      REQUIRE(staging->FinishBucket(b.index).ok());
    }
    CHECK(counting.begun == begun_parked);  // nothing ran while writing
    REQUIRE(staging->Commit().ok());
    REQUIRE(testing::WaitFor([&] { return failed || last_version >= v; },
                             absl::Seconds(60)));
    REQUIRE(!failed);
  }
  stop = true;
  engine_thread.join();
  const InplaceWeightSource::Stats stats = (*source)->stats();
  CHECK(stats.writes == 5);
  CHECK(stats.invalidations == 0);
  INFO("park wait max " << stats.max_park_wait_seconds << " s");
  CHECK(engine.policy_version() == 5);
}

TEST_CASE(
    "inplace update: shutdown releases an engine parked on lost "
    "weights with an error instead of generating") {
  auto decoder = std::make_shared<model::DecoderModel>(
      Weights(1, model::WeightDType::kFloat32));
  auto source = InplaceWeightSource::Create(decoder, 0);
  REQUIRE(source.ok());
  weights::StagingWeights* staging = (*source)->staging().get();
  engine::TorchEngineModel engine_model(decoder, 256);
  engine::Engine engine(Options(), &engine_model, source->get(), 0);
  engine::SamplingParams params;
  params.max_tokens = 4;
  REQUIRE(engine.Add("a", {1, 2, 3}, params).ok());
  REQUIRE(Receive(staging, *Weights(2, model::WeightDType::kFloat32), 1, 0)
              .code() == absl::StatusCode::kDataLoss);
  absl::StatusOr<engine::StepStats> step;
  std::thread engine_thread([&] { step = engine.Step(); });
  REQUIRE(WaitParked(**source));
  (*source)->Shutdown();
  engine_thread.join();
  CHECK(step.status().code() == absl::StatusCode::kCancelled);
  CHECK(engine.Snapshot().generated_tokens == 0);
}

}  // namespace
}  // namespace tandem::rollout
