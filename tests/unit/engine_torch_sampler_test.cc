// Sampling on the logits' device (engine/torch_sampler.h; issue 22 item 2)
// follows the host sampler's rule: run here on CPU tensors (the same code
// runs on a GPU, where tests/gpu/ repeats the comparison on CUDA):
//  * SampleRows picks the host sampler's token for the same uniform draw
//    (greedy, temperature, top-k, top-p and their mixes), with the same
//    log-prob up to float32 rounding;
//  * over many draws its tokens follow the softmax probabilities;
//  * a whole engine run with TorchEngineModel sampling "on the device"
//    generates the same tokens as with the host sampler.

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/torch_engine_model.h"
#include "engine/torch_sampler.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::engine {
namespace {

TEST_CASE("SampleRows picks the host sampler's token for the same draw",
          "[engine][sampler]") {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const int64_t vocab = 257;
  // Every mix of temperature, top-k and top-p the engine accepts.
  std::vector<SamplingParams> kinds;
  for (float t : {0.0f, 0.6f, 1.0f, 1.5f}) {
    for (int32_t k : {0, 1, 7, 64}) {
      for (float p : {1.0f, 0.9f, 0.3f}) {
        SamplingParams s;
        s.temperature = t;
        s.top_k = k;
        s.top_p = p;
        kinds.push_back(s);
      }
    }
  }
  const int64_t rows = 2400;
  torch::manual_seed(5);
  at::Tensor logits = torch::randn({rows, vocab}) * 3.0;
  // Some masked tokens (-inf), as a grammar or a stop mask would set.
  logits.index_put_({torch::randint(0, rows, {300}),
                     torch::randint(0, vocab, {300})},
                    -std::numeric_limits<float>::infinity());
  std::vector<SampleRequest> requests(rows);
  for (int64_t r = 0; r < rows; ++r) {
    requests[r].params = &kinds[r % kinds.size()];
    requests[r].uniform = uniform(rng);
  }
  auto device = SampleRows(logits, requests);
  INFO(device.status().ToString());
  REQUIRE(device.ok());
  const at::Tensor host_logits = logits.contiguous();
  int same = 0;
  double worst_logprob = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const SampledToken host = SampleTokenWithUniform(
        host_logits[r].data_ptr<float>(), static_cast<int32_t>(vocab),
        *requests[r].params, requests[r].uniform);
    if (host.token == (*device)[r].token) {
      ++same;
      worst_logprob = std::max(
          worst_logprob,
          static_cast<double>(std::abs(host.logprob - (*device)[r].logprob)));
    }
  }
  INFO(same << " of " << rows << " equal; worst log-prob difference "
            << worst_logprob);
  // float32 scaled logits against the host's double: a draw within
  // rounding of a boundary may differ (none did in this draw).
  CHECK(same >= rows - 2);
  CHECK(worst_logprob < 1e-4);
}

TEST_CASE("SampleRows' tokens follow the softmax probabilities",
          "[engine][sampler]") {
  const at::Tensor row = torch::tensor({2.0f, 1.0f, 0.0f, -1.0f, 0.5f, -3.0f});
  const int64_t draws = 20000;
  SamplingParams params;
  params.temperature = 0.8f;
  std::vector<SampleRequest> requests(draws);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (auto& r : requests) r = {&params, uniform(rng)};
  auto sampled = SampleRows(row.unsqueeze(0).expand({draws, 6}), requests);
  REQUIRE(sampled.ok());
  std::vector<double> counts(6, 0.0);
  for (const SampledToken& s : *sampled) counts[s.token] += 1.0;
  const at::Tensor probs = torch::softmax(row / 0.8, 0);
  for (int i = 0; i < 6; ++i) {
    const double p = probs[i].item<double>();
    // Within 4.5 standard errors of the binomial count.
    INFO("token " << i << ": " << counts[i] << " draws, expected " << p * draws);
    CHECK(std::abs(counts[i] - p * draws) <=
          4.5 * std::sqrt(draws * p * (1 - p)) + 1);
    CHECK(std::abs((*sampled)[0].logprob -
                   std::log(probs[(*sampled)[0].token].item<double>())) < 1e-5);
  }
}

// The shortcuts of SampleRows: a step of greedy rows only (no scaling, no
// inverse CDF) and one with a single temperature row among greedy ones (the
// CDF of that row only) give the host sampler's tokens and log-probs.
TEST_CASE("SampleRows' greedy-only and mostly-greedy steps",
          "[engine][sampler]") {
  torch::manual_seed(8);
  const int64_t rows = 6, vocab = 1000;
  const at::Tensor logits = torch::randn({rows, vocab}) * 4.0;
  SamplingParams greedy, warm;
  greedy.temperature = 0.0f;
  warm.temperature = 0.7f;
  for (bool mixed : {false, true}) {
    INFO((mixed ? "one temperature row" : "greedy only"));
    std::vector<SampleRequest> requests(rows, SampleRequest{&greedy, 0.0});
    if (mixed) requests[3] = {&warm, 0.62};
    auto device = SampleRows(logits, requests);
    REQUIRE(device.ok());
    for (int64_t r = 0; r < rows; ++r) {
      INFO("row " << r);
      const SampledToken host = SampleTokenWithUniform(
          logits[r].contiguous().data_ptr<float>(), vocab, *requests[r].params,
          requests[r].uniform);
      CHECK((*device)[r].token == host.token);
      CHECK(std::abs((*device)[r].logprob - host.logprob) < 1e-4);
      if (requests[r].params == &greedy) {
        CHECK((*device)[r].token == logits[r].argmax().item<int64_t>());
      }
    }
  }
}

std::map<std::string, FinishedSample> Generate(SampleWhere where) {
  auto weights = model::RandomInit(model::testing::TinyQwen2Config(), 9);
  REQUIRE(weights.ok());
  auto decoder = std::make_shared<model::DecoderModel>(*weights);
  TorchEngineModel model(decoder, 256, {.sampling = where});
  EngineOptions options;
  options.limits.max_num_seqs = 8;
  options.limits.max_batched_tokens = 64;
  options.num_kv_blocks = 256;
  options.block_size = 16;
  Engine engine(options, &model, nullptr, 0);
  for (int r = 0; r < 6; ++r) {
    SamplingParams p;
    p.temperature = r == 0 ? 0.0f : 1.0f;
    p.top_k = r == 4 ? 10 : 0;
    p.top_p = r == 5 ? 0.8f : 1.0f;
    p.max_tokens = 12;
    p.seed = 100 + r;
    p.n = 2;
    REQUIRE(engine.Add("r" + std::to_string(r), {3, 5 + r, 7, 9}, p).ok());
  }
  std::map<std::string, FinishedSample> out;
  for (int i = 0; i < 1000 && !engine.idle(); ++i) {
    REQUIRE(engine.Step().ok());
    for (auto& f : engine.TakeFinished()) {
      out[f.request_id + "/" + std::to_string(f.sample_index)] = f;
    }
  }
  return out;
}

TEST_CASE("an engine sampling on the device generates the host's tokens",
          "[engine][sampler]") {
  const auto host = Generate(SampleWhere::kHost);
  const auto device = Generate(SampleWhere::kDevice);
  REQUIRE(host.size() == 12);
  REQUIRE(device.size() == host.size());
  for (const auto& [id, h] : host) {
    INFO(id);
    const FinishedSample& d = device.at(id);
    CHECK(d.output == h.output);
    REQUIRE(d.logprobs.size() == h.logprobs.size());
    for (size_t i = 0; i < h.logprobs.size(); ++i) {
      CHECK(std::abs(d.logprobs[i] - h.logprobs[i]) < 1e-4);
    }
  }
}

}  // namespace
}  // namespace tandem::engine
