// Prefill and decode throughput of DecoderModel on random weights.
//
//   model_bench [--model tiny|qwen2.5-0.5b|all] [--dtype fp32|bf16|all]
//               [--batches 1,8,32] [--prompt N] [--steps N] [--threads N]
//               [--attention auto|per_sequence|padded] [--repeat N]
//
// For each model, dtype and batch size B: B prompts of --prompt tokens are
// prefilled in one batched ForwardWithCache call (prefill tok/s = B *
// prompt / seconds), then --steps DecodeStep calls add one token to each
// sequence (decode tok/s = B * steps / seconds). Each figure is the best of
// --repeat runs (default 3), since the machine is shared. Peak RSS is the
// process's high-water mark after each model (run one model per process for a
// clean per-model number). Weights are random: speed does not depend on values.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/model/decoder_model.h"
#include "common/model/kv_cache.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"

namespace tandem::model {
namespace {

struct BenchFlags {
  std::string model = "all";
  std::string dtype = "all";
  std::vector<int64_t> batches = {1, 8, 32};
  int64_t prompt = 0;  // 0: 128 for tiny, 64 for qwen2.5-0.5b
  int64_t steps = 0;   // 0: 64 for tiny, 16 for qwen2.5-0.5b
  int threads = 0;     // 0: LibTorch's default
  AttentionMode attention = AttentionMode::kAuto;
  int64_t repeat = 3;  // best of N runs: the machine is shared and noisy
};

ModelConfig TinyConfig() {
  ModelConfig c;
  c.architecture = Architecture::kQwen2;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 768;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 1024;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  return c;
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

double PeakRssMiB() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // ru_maxrss is in KiB on Linux.
}

void Die(const absl::Status& status) {
  std::fprintf(stderr, "model_bench: %s\n", status.ToString().c_str());
  std::exit(1);
}

// Returns {prefill tok/s, decode tok/s}.
std::pair<double, double> RunBatch(const DecoderModel& model, int64_t batch,
                                   int64_t prompt, int64_t steps) {
  const ModelConfig& config = model.weights()->config();
  std::vector<std::unique_ptr<ContiguousKvCache>> caches;
  std::vector<std::vector<int32_t>> prompts(batch);
  std::vector<SequenceStep> prefill;
  for (int64_t b = 0; b < batch; ++b) {
    auto cache = ContiguousKvCache::Create(config, model.weights()->dtype(),
                                           model.weights()->device(),
                                           prompt + steps, prompt + steps);
    if (!cache.ok()) Die(cache.status());
    caches.push_back(std::move(*cache));
    for (int64_t i = 0; i < prompt; ++i) {
      prompts[b].push_back(
          static_cast<int32_t>((b * 131 + i * 31) % config.vocab_size));
    }
    prefill.push_back({prompts[b], caches[b].get()});
  }
  auto start = std::chrono::steady_clock::now();
  auto logits = model.ForwardWithCache(prefill);
  if (!logits.ok()) Die(logits.status());
  const double prefill_seconds = Seconds(start);

  std::vector<KvCache*> views;
  for (auto& cache : caches) views.push_back(cache.get());
  std::vector<int32_t> next(batch);
  start = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    const at::Tensor argmax = logits->argmax(-1);
    for (int64_t b = 0; b < batch; ++b) {
      next[b] = static_cast<int32_t>(argmax[b].item<int64_t>());
    }
    logits = model.DecodeStep(next, views);
    if (!logits.ok()) Die(logits.status());
  }
  const double decode_seconds = Seconds(start);
  return {batch * prompt / prefill_seconds, batch * steps / decode_seconds};
}

void RunModel(const std::string& name, ModelConfig config,
              const BenchFlags& flags) {
  const int64_t prompt =
      flags.prompt > 0 ? flags.prompt : (name == "tiny" ? 128 : 64);
  const int64_t steps =
      flags.steps > 0 ? flags.steps : (name == "tiny" ? 64 : 16);
  for (WeightDType dtype : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
    const bool is_bf16 = dtype == WeightDType::kBFloat16;
    if (flags.dtype != "all" && flags.dtype != (is_bf16 ? "bf16" : "fp32")) {
      continue;
    }
    config.dtype = dtype;
    const auto init_start = std::chrono::steady_clock::now();
    auto weights = RandomInit(config, 1);
    if (!weights.ok()) Die(weights.status());
    std::printf("# %s %s: %.1fM parameters, %.0f MiB, init %.1f s\n",
                name.c_str(), is_bf16 ? "bf16" : "fp32",
                (*weights)->num_parameters() / 1e6,
                (*weights)->num_bytes() / 1048576.0, Seconds(init_start));
    DecoderModel model(*weights, {.attention = flags.attention});
    RunBatch(model, 1, 8, 2);  // warm-up: thread pools, allocator
    for (int64_t batch : flags.batches) {
      double prefill = 0, decode = 0;
      for (int64_t r = 0; r < flags.repeat; ++r) {
        const auto [p, d] = RunBatch(model, batch, prompt, steps);
        prefill = std::max(prefill, p);
        decode = std::max(decode, d);
      }
      std::printf(
          "%-13s %-4s batch %2lld prompt %4lld steps %3lld | prefill %9.1f "
          "tok/s | decode %8.1f tok/s (%7.2f ms/step)\n",
          name.c_str(), is_bf16 ? "bf16" : "fp32",
          static_cast<long long>(batch), static_cast<long long>(prompt),
          static_cast<long long>(steps), prefill, decode,
          1000.0 * batch / decode);
      std::fflush(stdout);
    }
  }
  std::printf("# %s peak RSS %.0f MiB\n", name.c_str(), PeakRssMiB());
}

BenchFlags ParseFlags(int argc, char** argv) {
  BenchFlags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&](int64_t* out) {
      if (value == nullptr || !absl::SimpleAtoi(value, out)) {
        std::fprintf(stderr, "model_bench: %s needs an integer\n", arg.c_str());
        std::exit(2);
      }
      ++i;
    };
    if (arg == "--model" && value != nullptr) {
      flags.model = value;
      ++i;
    } else if (arg == "--dtype" && value != nullptr) {
      flags.dtype = value;
      ++i;
    } else if (arg == "--batches" && value != nullptr) {
      flags.batches.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int64_t b = 0;
        if (!absl::SimpleAtoi(part, &b) || b <= 0) {
          std::fprintf(stderr, "model_bench: bad --batches %s\n", value);
          std::exit(2);
        }
        flags.batches.push_back(b);
      }
      ++i;
    } else if (arg == "--attention" && value != nullptr) {
      const std::string mode = value;
      if (mode == "auto") {
        flags.attention = AttentionMode::kAuto;
      } else if (mode == "per_sequence") {
        flags.attention = AttentionMode::kPerSequence;
      } else if (mode == "padded") {
        flags.attention = AttentionMode::kPadded;
      } else {
        std::fprintf(stderr, "model_bench: bad --attention %s\n", value);
        std::exit(2);
      }
      ++i;
    } else if (arg == "--prompt") {
      need(&flags.prompt);
    } else if (arg == "--repeat") {
      need(&flags.repeat);
    } else if (arg == "--steps") {
      need(&flags.steps);
    } else if (arg == "--threads") {
      int64_t threads = 0;
      need(&threads);
      flags.threads = static_cast<int>(threads);
    } else {
      std::fprintf(stderr,
                   "usage: model_bench [--model tiny|qwen2.5-0.5b|all] "
                   "[--dtype fp32|bf16|all] [--batches 1,8,32] [--prompt N] "
                   "[--steps N] [--threads N] "
                   "[--attention auto|per_sequence|padded] [--repeat N]\n");
      std::exit(2);
    }
  }
  return flags;
}

}  // namespace
}  // namespace tandem::model

int main(int argc, char** argv) {
  using namespace tandem::model;
  const BenchFlags flags = ParseFlags(argc, argv);
  if (flags.threads > 0) at::set_num_threads(flags.threads);
  std::printf("# LibTorch intra-op threads: %d\n", at::get_num_threads());
  if (flags.model == "all" || flags.model == "tiny") {
    RunModel("tiny", TinyConfig(), flags);
  }
  if (flags.model == "all" || flags.model == "qwen2.5-0.5b") {
    RunModel("qwen2.5-0.5b", Qwen2_5_0_5BConfig(), flags);
  }
  return 0;
}
