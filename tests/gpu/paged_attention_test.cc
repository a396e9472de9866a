// GPU cases of the paged decode attention kernel (kernels/cuda/
// paged_attention_cuda.h through common/model/paged_attention.h), linked
// into gpu_device_test (its main skips without a device):
//  * kernel vs PagedBatch's gather + scaled_dot_product_attention on the
//    same CUDA pool, float32 (1e-4), bfloat16 and float16 (3e-2), several
//    batch sizes, GQA, ragged lengths at block edges, head_dim 64 and 128;
//  * the kernel on CUDA vs its CPU reference on the same values;
//  * the engine's greedy tokens with engine.paged_attention kernel equal
//    the gather path's, eager and replayed from CUDA graphs.

#include "common/model/paged_attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/kv_cache.h"
#include "common/model/model_weights.h"
#include "common/model/paged_kv_cache.h"
#include "engine/engine.h"
#include "engine/torch_engine_model.h"
#include "tests/unit/model_test_util.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem {
namespace {

const at::Device kCudaDevice(at::kCUDA, 0);

double MaxRelativeError(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kCPU, at::kFloat);
  const at::Tensor y = b.to(at::kCPU, at::kFloat);
  return (x - y).abs().max().item<double>() /
         std::max(1e-12, y.abs().max().item<double>());
}

struct Shape {
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<int64_t> lengths;
};

// Caches of `lengths` on one CUDA pool of one layer with random contents,
// their blocks interleaved (they grow a token at a time in turn); each
// holds lengths[b] - 1 tokens, the decode step adds the last.
struct CudaPool {
  std::shared_ptr<model::KvBlockPool> pool;
  std::vector<std::unique_ptr<model::PagedKvCache>> caches;
};

CudaPool MakeCudaPool(const Shape& s, model::PagedAttention attention,
                      at::ScalarType dtype) {
  model::ModelConfig config = model::testing::TinyQwen2Config();
  config.num_hidden_layers = 1;
  config.num_attention_heads = s.heads;
  config.num_key_value_heads = s.kv_heads;
  config.head_dim = s.head_dim;
  int64_t blocks = 0;
  for (int64_t l : s.lengths) blocks += (l + s.block_size - 1) / s.block_size;
  CudaPool p;
  auto pool = model::KvBlockPool::Create(config, dtype, kCudaDevice, blocks + 2,
                                         s.block_size, attention);
  REQUIRE(pool.ok());
  p.pool = *pool;
  at::manual_seed(7);
  p.pool->keys(0).copy_(at::randn(p.pool->keys(0).sizes()));
  p.pool->values(0).copy_(at::randn(p.pool->values(0).sizes()));
  for (size_t b = 0; b < s.lengths.size(); ++b) {
    auto cache = model::PagedKvCache::Create(config, p.pool, 1 << 20);
    REQUIRE(cache.ok());
    p.caches.push_back(std::move(*cache));
  }
  const int64_t longest = *std::max_element(s.lengths.begin(), s.lengths.end());
  for (int64_t t = 0; t < longest; ++t) {
    for (size_t b = 0; b < s.lengths.size(); ++b) {
      if (t >= s.lengths[b]) continue;
      REQUIRE(p.caches[b]->Reserve(1).ok());
      if (t + 1 < s.lengths[b]) p.caches[b]->Commit(1);
    }
  }
  return p;
}

at::Tensor Attend(CudaPool* p, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v) {
  std::vector<model::KvCache*> caches;
  for (auto& c : p->caches) caches.push_back(c.get());
  auto plan =
      model::PagedBatch::Plan(caches, std::vector<int64_t>(caches.size(), 1));
  REQUIRE(plan != nullptr);
  return plan->Attend(0, q, k, v, 1.0 / std::sqrt(q.size(2)));
}

std::vector<Shape> Shapes() {
  std::vector<int64_t> ragged64;
  for (int64_t b = 0; b < 64; ++b) ragged64.push_back(1 + (b * 37) % 700);
  ragged64[0] = 16;
  ragged64[1] = 17;
  ragged64[2] = 512;
  return {
      {4, 2, 16, 4, {1, 4, 5, 8, 13}},
      {14, 2, 64, 16, ragged64},                  // Qwen2.5-0.5B's heads
      {32, 8, 128, 16, {33, 1, 256, 257, 1000}},  // Llama-8B's heads
      {8, 8, 128, 32, {32, 31, 64, 65}},
  };
}

TEST_CASE("paged decode kernel on CUDA equals gather + SDPA",
          "[gpu][paged][attention]") {
  const struct {
    at::ScalarType dtype;
    double tolerance;
  } kDtypes[] = {{at::kFloat, 1e-4}, {at::kBFloat16, 3e-2}, {at::kHalf, 3e-2}};
  for (const auto& d : kDtypes) {
    for (const Shape& s : Shapes()) {
      INFO(d.dtype << " heads " << s.heads << "/" << s.kv_heads << " dim "
                   << s.head_dim << " block " << s.block_size << " batch "
                   << s.lengths.size());
      CudaPool gather =
          MakeCudaPool(s, model::PagedAttention::kGather, d.dtype);
      CudaPool kernel = MakeCudaPool(s, model::PagedAttention::kAuto, d.dtype);
      CHECK(kernel.pool->decode_kernel());
      CHECK_FALSE(gather.pool->decode_kernel());
      const int64_t batch = static_cast<int64_t>(s.lengths.size());
      const auto options =
          at::TensorOptions().dtype(d.dtype).device(kCudaDevice);
      const at::Tensor q = at::randn({batch, s.heads, s.head_dim}, options);
      const at::Tensor k = at::randn({batch, s.kv_heads, s.head_dim}, options);
      const at::Tensor v = at::randn({batch, s.kv_heads, s.head_dim}, options);
      const at::Tensor want = Attend(&gather, q, k, v);
      const at::Tensor got = Attend(&kernel, q, k, v);
      REQUIRE(got.sizes() == want.sizes());
      CHECK(got.scalar_type() == d.dtype);
      CHECK(MaxRelativeError(got, want) < d.tolerance);
      // The CPU reference on the same values (float32 accumulation on
      // both: summation order only).
      if (d.dtype == at::kFloat) {
        std::vector<model::KvCache*> caches;
        for (auto& c : kernel.caches) caches.push_back(c.get());
        const at::Tensor cpu = model::internal::PagedDecodeAttentionCpu(
            q.cpu(), kernel.pool->keys(0).cpu(), kernel.pool->values(0).cpu(),
            [&] {
              const int64_t bs = s.block_size;
              const int64_t longest =
                  *std::max_element(s.lengths.begin(), s.lengths.end());
              at::Tensor t =
                  at::zeros({batch, (longest + bs - 1) / bs}, at::kLong);
              for (int64_t b = 0; b < batch; ++b) {
                const auto& blocks = kernel.caches[b]->blocks();
                for (size_t i = 0; i < blocks.size(); ++i) {
                  t[b][static_cast<int64_t>(i)] = blocks[i];
                }
              }
              return t;
            }(),
            at::tensor(s.lengths, at::kLong), s.block_size,
            1.0 / std::sqrt(s.head_dim));
        CHECK(MaxRelativeError(got, cpu.view({batch, -1})) < 1e-5);
      }
    }
  }
}

// Greedy tokens of a small engine run on CUDA with `attention`, with or
// without CUDA graphs.
std::vector<int32_t> GreedyTokens(model::PagedAttention attention, bool graphs,
                                  model::WeightDType dtype, int64_t* replays) {
  auto cpu = model::RandomInit(model::testing::TinyQwen2Config(), 5,
                               {.norm_noise = 0.1});
  REQUIRE(cpu.ok());
  auto placed = (*cpu)->To(kCudaDevice, dtype);
  REQUIRE(placed.ok());
  auto decoder = std::make_shared<model::DecoderModel>(*placed);
  engine::EngineOptions options;
  options.limits.max_num_seqs = 6;
  options.limits.max_batched_tokens = 64;
  options.num_kv_blocks = 96;
  options.block_size = 4;
  engine::TorchEngineModelOptions model_options;
  model_options.kv_layout = engine::KvLayout::kPaged;
  model_options.kv_blocks = options.num_kv_blocks;
  model_options.block_size = options.block_size;
  model_options.cuda_graphs = graphs;
  model_options.paged_attention = attention;
  engine::TorchEngineModel m(decoder, 64, model_options);
  engine::Engine e(options, &m, nullptr, 0);
  for (int r = 0; r < 6; ++r) {
    engine::SamplingParams greedy;
    greedy.temperature = 0;
    greedy.max_tokens = 8 + 3 * r;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 2 + 2 * r; ++i) prompt.push_back(1 + (r * 7 + i) % 90);
    REQUIRE(e.Add("r" + std::to_string(r), prompt, greedy).ok());
  }
  std::vector<int32_t> tokens;
  for (int i = 0; i < 1000 && !e.idle(); ++i) {
    const auto step = e.Step();
    INFO((step.ok() ? "" : step.status().ToString()));
    REQUIRE(step.ok());
    for (auto& f : e.TakeFinished()) {
      tokens.insert(tokens.end(), f.output.begin(), f.output.end());
    }
  }
  *replays = m.graph_replays();
  return tokens;
}

TEST_CASE("engine greedy tokens equal with the paged decode kernel",
          "[gpu][paged][attention]") {
  int64_t replays = 0;
  const auto gather = GreedyTokens(model::PagedAttention::kGather, false,
                                   model::WeightDType::kFloat32, &replays);
  CHECK(gather.size() == 6 * 8 + 3 * 15);
  CHECK(GreedyTokens(model::PagedAttention::kKernel, false,
                     model::WeightDType::kFloat32, &replays) == gather);
  // Captured in CUDA graphs (the block tables derived on the device).
  CHECK(GreedyTokens(model::PagedAttention::kKernel, true,
                     model::WeightDType::kFloat32, &replays) == gather);
  CHECK(replays > 0);
}

}  // namespace
}  // namespace tandem
