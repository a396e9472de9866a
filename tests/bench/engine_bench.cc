// The Olmo 3 table on this machine: generation throughput of the rollout
// engine on the built-in tiny model with a long-tail completion-length
// distribution and a new weight version every K engine steps, for
//   (a) static batching + drain before each update,
//   (b) continuous batching + drain before each update,
//   (c) continuous batching + inflight updates (pointer swap),
//   (d) continuous batching, no updates (steady-state reference),
// run side by side in one process on the same requests. Prints tokens/s,
// the ratios (c)/(a), (c)/(b), (c)/(d), and inflight pause percentiles.
//
//   engine_bench [--requests N] [--batch B] [--update-every K]
//                [--max-tokens M] [--threads T] [--repeat R]
//                [--attention 0|1|2]  (auto, per-sequence, padded)
//                [--flat-step-ms F]
//                [--model DIR] [--device cpu|cuda|cuda:N]
//                [--dtype auto|float32|bfloat16]
//                [--kv-layout auto|contiguous|paged|both]
//                [--paged-attention auto|gather|kernel|both]
//                [--cuda-graphs 0|1]
//
// --kv-layout picks TorchEngineModel's KV layout (engine.kv_layout) for
// the table; `both` instead runs mode (d) with the contiguous and the paged
// layout side by side (interleaved, best of --repeat each) and prints the
// ratio paged / contiguous, which is how kAuto's CPU choice was made.
// --paged-attention picks the decode attention over the paged pool
// (engine.paged_attention; default: the engine's); `both` runs mode (d)
// with paged caches and the gather and the kernel side by side
// (interleaved, best of --repeat each) and prints kernel / gather.
// --cuda-graphs 1 replays decode steps from CUDA graphs (engine.cuda_graphs;
// paged caches on a CUDA device only).
//
// --model DIR runs a Hugging Face model directory (config.json and
// safetensors; no tokenizer needed: the prompts are token ids) instead of
// the built-in tiny model; the weight versions are random draws of its
// shape. --device / --dtype place the model as model.device / model.dtype
// do in the daemons (tests/gpu/run.sh runs the table on a GPU this way).
//
// --flat-step-ms F emulates the cost model of a memory-bound accelerator,
// where a decode step costs about the same whatever the batch size: every
// engine step still runs the real model, then waits until F ms have passed
// since it began (F should exceed the slowest real step, so every step
// costs F). This isolates what the scheduler and the update policy gain;
// it is not a measurement of this machine's model throughput.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "absl/time/clock.h"
#include "common/model/decoder_model.h"
#include "common/model/device.h"
#include "common/model/paged_attention.h"
#include "common/model/torch_device.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_loader.h"
#include "common/model/model_weights.h"
#include "engine/engine.h"
#include "engine/torch_engine_model.h"
#include "services/rollout/weight_update_sources.h"

namespace tandem::engine {
namespace {

struct Flags {
  int requests = 256;
  int batch = 32;
  int update_every = 8;
  int max_tokens = 48;
  int threads = 1;
  int repeat = 2;
  // 0 auto, 1 per-sequence, 2 padded attention.
  int attention = 0;
  int flat_step_ms = 0;  // 0: real step times
  int cuda_graphs = 0;
  std::string model;
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string kv_layout = "auto";
  std::string paged_attention;  // empty: the engine's default
};

KvLayout LayoutOf(const std::string& name) {
  return name == "paged"        ? KvLayout::kPaged
         : name == "contiguous" ? KvLayout::kContiguous
                                : KvLayout::kAuto;
}

// The real model, each Forward() padded to a fixed duration (see above).
class FlatStepModel : public EngineModel {
 public:
  FlatStepModel(EngineModel* inner, absl::Duration step)
      : inner_(inner), step_(step) {}
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  absl::StatusOr<std::vector<float>> Forward(
      const std::vector<ForwardChunk>& chunks) override {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<float>> out = inner_->Forward(chunks);
    const absl::Duration took = absl::Now() - start;
    if (took > step_) ++overruns_;
    absl::SleepFor(step_ - took);
    return out;
  }
  absl::StatusOr<std::vector<SampledToken>> ForwardSample(
      const std::vector<ForwardChunk>& chunks,
      const std::vector<SampleRequest>& requests) override {
    const absl::Time start = absl::Now();
    auto out = inner_->ForwardSample(chunks, requests);
    const absl::Duration took = absl::Now() - start;
    if (took > step_) ++overruns_;
    absl::SleepFor(step_ - took);
    return out;
  }
  bool ForkCache(uint64_t src, uint64_t dst, int32_t num_tokens) override {
    return inner_->ForkCache(src, dst, num_tokens);
  }
  void ReleaseCache(uint64_t seq_id) override { inner_->ReleaseCache(seq_id); }
  // Steps whose real forward took longer than the fixed duration.
  int overruns() const { return overruns_; }

 private:
  EngineModel* const inner_;
  const absl::Duration step_;
  int overruns_ = 0;
};

struct Result {
  double tokens_per_second = 0;
  uint64_t tokens = 0;
  int updates = 0;
  int steps = 0;
  int overruns = 0;  // --flat-step-ms steps that took longer
  std::vector<double> pauses;
};

// Completion lengths with mean/max ~= 0.44 (Olmo 3: 14k mean, 32k max):
// L = ceil(M * u^1.27), u uniform, which has mean M / 2.27.
std::vector<int> LongTailLengths(int n, int max_tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::max(
        1, static_cast<int>(std::ceil(max_tokens * std::pow(u(rng), 1.27)))));
  }
  return out;
}

Result RunOnce(
    const model::LoadedModel& loaded,
    const std::vector<std::shared_ptr<model::ModelWeights>>& versions,
    const Flags& flags, const std::vector<int>& lengths, bool static_batching,
    bool drain, bool updates, KvLayout layout,
    std::optional<model::PagedAttention> attention = std::nullopt) {
  model::DecoderOptions decoder_options;
  decoder_options.attention =
      static_cast<model::AttentionMode>(flags.attention);
  auto decoder =
      std::make_shared<model::DecoderModel>(versions[0], decoder_options);
  EngineOptions options;
  options.limits.max_num_seqs = flags.batch;
  options.limits.max_batched_tokens = 4096;
  options.num_kv_blocks = 4096;
  options.block_size = 16;
  TorchEngineModelOptions model_options;
  model_options.kv_layout = layout;
  model_options.kv_blocks = options.num_kv_blocks;
  model_options.block_size = options.block_size;
  model_options.cuda_graphs = flags.cuda_graphs != 0;
  if (!flags.paged_attention.empty() && flags.paged_attention != "both") {
    model_options.paged_attention =
        *model::ParsePagedAttention(flags.paged_attention);
  }
  if (attention.has_value()) model_options.paged_attention = *attention;
  TorchEngineModel torch_model(decoder, loaded.max_tokens, model_options);
  FlatStepModel flat_model(&torch_model,
                           absl::Milliseconds(flags.flat_step_ms));
  EngineModel* engine_model = &torch_model;
  if (flags.flat_step_ms > 0) engine_model = &flat_model;
  rollout::StagedWeightSource source(decoder);
  options.static_batching = static_batching;
  options.update_policy = drain ? EngineOptions::UpdatePolicy::kDrain
                                : EngineOptions::UpdatePolicy::kInflight;
  // No end-of-sequence: every sample runs to its drawn length.
  Engine engine(options, engine_model, updates ? &source : nullptr, 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = i + 1;
    p.max_tokens = lengths[i];
    std::vector<int32_t> prompt = {14, static_cast<int32_t>(i % 10), 10,
                                   static_cast<int32_t>((i / 10) % 10), 12};
    if (!engine.Add("r" + std::to_string(i), prompt, p).ok()) std::abort();
  }
  Result result;
  uint64_t version = 0;
  int steps = 0;
  const absl::Time start = absl::Now();
  while (!engine.idle()) {
    if (updates && steps > 0 && steps % flags.update_every == 0 &&
        source.ReadyVersion(engine.policy_version()) == 0) {
      ++version;
      source.Stage(version, versions[version % versions.size()]);
    }
    auto step = engine.Step();
    if (!step.ok()) {
      std::fprintf(stderr, "step failed: %s\n",
                   step.status().ToString().c_str());
      std::abort();
    }
    ++steps;
    result.tokens += step->decode_tokens;
    if (step->committed_update) {
      ++result.updates;
      result.pauses.push_back(step->pause_seconds);
    }
    engine.TakeFinished();
  }
  result.tokens_per_second =
      result.tokens / absl::ToDoubleSeconds(absl::Now() - start);
  result.steps = steps;
  result.overruns = flat_model.overruns();
  return result;
}

// The built-in model, or --model DIR without its tokenizer, placed as
// --device / --dtype say.
absl::StatusOr<model::LoadedModel> Load(const Flags& flags) {
  if (flags.model.empty()) {
    return model::LoadModel("", 1, flags.threads,
                            {.device = flags.device, .dtype = flags.dtype});
  }
  at::set_num_threads(flags.threads);
  ASSIGN_OR_RETURN(const model::DeviceName device,
                   model::ResolveDevice("--device", flags.device));
  ASSIGN_OR_RETURN(const std::optional<model::WeightDType> dtype,
                   model::ParseDTypeName("--dtype", flags.dtype));
  model::LoadOptions options;
  options.device = model::TorchDevice(device);
  // auto: bfloat16 on a GPU, the checkpoint's own dtype on the CPU.
  options.dtype = device.cuda ? std::optional(model::ResolveDType(
                                    dtype, device, model::WeightDType::kFloat32))
                              : dtype;
  ASSIGN_OR_RETURN(auto weights, model::LoadHfModel(flags.model, options));
  model::LoadedModel loaded;
  loaded.max_tokens = weights->config().max_position_embeddings;
  loaded.description = absl::StrCat(
      flags.model, " on ", device.ToString(), " in ",
      model::WeightDTypeName(weights->config().dtype));
  loaded.decoder = std::make_shared<model::DecoderModel>(std::move(weights));
  return loaded;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

int Main(int argc, char** argv) {
  Flags flags;
  const std::pair<const char*, int*> known[] = {
      {"--requests", &flags.requests},
      {"--batch", &flags.batch},
      {"--update-every", &flags.update_every},
      {"--max-tokens", &flags.max_tokens},
      {"--threads", &flags.threads},
      {"--repeat", &flags.repeat},
      {"--attention", &flags.attention},
      {"--flat-step-ms", &flags.flat_step_ms},
      {"--cuda-graphs", &flags.cuda_graphs}};
  const std::pair<const char*, std::string*> text[] = {
      {"--model", &flags.model},
      {"--device", &flags.device},
      {"--dtype", &flags.dtype},
      {"--kv-layout", &flags.kv_layout},
      {"--paged-attention", &flags.paged_attention}};
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    std::string* text_target = nullptr;
    for (const auto& [name, field] : text) {
      if (f == name) text_target = field;
    }
    if (text_target != nullptr) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", f.c_str());
        return 2;
      }
      *text_target = argv[i + 1];
      continue;
    }
    int* target = nullptr;
    for (const auto& [name, field] : known) {
      if (f == name) target = field;
    }
    if (target == nullptr) {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      return 2;
    }
    int v = 0;
    if (i + 1 >= argc || !absl::SimpleAtoi(argv[i + 1], &v) || v < 0 ||
        (v == 0 && f != "--attention" && f != "--flat-step-ms" &&
         f != "--cuda-graphs")) {
      std::fprintf(stderr, "%s needs a %s integer, got '%s'\n", f.c_str(),
                   f == "--attention" || f == "--flat-step-ms" ||
                           f == "--cuda-graphs"
                       ? "non-negative"
                       : "positive",
                   i + 1 < argc ? argv[i + 1] : "");
      return 2;
    }
    *target = v;
  }
  if (flags.kv_layout != "auto" && flags.kv_layout != "contiguous" &&
      flags.kv_layout != "paged" && flags.kv_layout != "both") {
    std::fprintf(stderr,
                 "--kv-layout must be auto, contiguous, paged or both, got "
                 "'%s'\n",
                 flags.kv_layout.c_str());
    return 2;
  }
  if (!flags.paged_attention.empty() && flags.paged_attention != "both" &&
      !model::ParsePagedAttention(flags.paged_attention).ok()) {
    std::fprintf(stderr,
                 "--paged-attention must be auto, gather, kernel or both, "
                 "got '%s'\n",
                 flags.paged_attention.c_str());
    return 2;
  }
  auto loaded = Load(flags);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  std::vector<std::shared_ptr<model::ModelWeights>> versions;
  const auto live = loaded->decoder->weights();
  for (uint64_t seed : {1, 2, 3}) {
    auto version = model::RandomInit(live->config(), seed,
                                     {.device = live->device()});
    if (!version.ok()) {
      std::fprintf(stderr, "%s\n", version.status().ToString().c_str());
      return 1;
    }
    versions.push_back(*std::move(version));
  }
  const std::vector<int> lengths =
      LongTailLengths(flags.requests, flags.max_tokens, 7);
  double sum = 0;
  int longest = 0;
  for (int l : lengths) {
    sum += l;
    longest = std::max(longest, l);
  }
  std::printf(
      "model: %s | requests %d, batch %d, update every %d steps, lengths "
      "mean %.1f max %d (mean/max %.2f), torch threads %d\n",
      loaded->description.c_str(), flags.requests, flags.batch,
      flags.update_every, sum / lengths.size(), longest,
      sum / lengths.size() / longest, flags.threads);
  if (flags.flat_step_ms > 0) {
    std::printf(
        "EMULATION: every engine step padded to %d ms (flat step cost, as on "
        "a memory-bound accelerator); not this machine's throughput\n",
        flags.flat_step_ms);
  }
  if (flags.paged_attention == "both") {
    // Mode (d) on paged caches, gather then kernel in each round.
    Result best_path[2];
    std::vector<double> ratios;
    for (int r = 0; r < flags.repeat; ++r) {
      double tps[2];
      for (int a = 0; a < 2; ++a) {
        Result res = RunOnce(*loaded, versions, flags, lengths, false, false,
                             false, KvLayout::kPaged,
                             a == 0 ? model::PagedAttention::kGather
                                    : model::PagedAttention::kKernel);
        tps[a] = res.tokens_per_second;
        if (tps[a] > best_path[a].tokens_per_second) best_path[a] = res;
      }
      ratios.push_back(tps[1] / tps[0]);
    }
    std::printf("(d) continuous, no updates, paged, batch %d: gather %.1f "
                "tok/s, kernel %.1f tok/s, kernel/gather %.3f; per round "
                "median %.3f [%.3f, %.3f]\n",
                flags.batch, best_path[0].tokens_per_second,
                best_path[1].tokens_per_second,
                best_path[1].tokens_per_second /
                    best_path[0].tokens_per_second,
                Percentile(ratios, 0.5),
                *std::min_element(ratios.begin(), ratios.end()),
                *std::max_element(ratios.begin(), ratios.end()));
    return 0;
  }
  if (flags.kv_layout == "both") {
    // Mode (d), contiguous then paged in each round.
    Result best_layout[2];
    std::vector<double> ratios;
    for (int r = 0; r < flags.repeat; ++r) {
      double tps[2];
      for (int l = 0; l < 2; ++l) {
        Result res = RunOnce(*loaded, versions, flags, lengths, false, false,
                             false,
                             l == 0 ? KvLayout::kContiguous : KvLayout::kPaged);
        tps[l] = res.tokens_per_second;
        if (tps[l] > best_layout[l].tokens_per_second) best_layout[l] = res;
      }
      ratios.push_back(tps[1] / tps[0]);
    }
    std::printf("(d) continuous, no updates, batch %d: contiguous %.1f tok/s, "
                "paged %.1f tok/s, paged/contiguous %.3f; per round median "
                "%.3f [%.3f, %.3f]\n",
                flags.batch, best_layout[0].tokens_per_second,
                best_layout[1].tokens_per_second,
                best_layout[1].tokens_per_second /
                    best_layout[0].tokens_per_second,
                Percentile(ratios, 0.5),
                *std::min_element(ratios.begin(), ratios.end()),
                *std::max_element(ratios.begin(), ratios.end()));
    return 0;
  }
  struct Mode {
    const char* name;
    bool static_batching, drain, updates;
  };
  const Mode modes[] = {{"(a) static + drain", true, true, true},
                        {"(b) continuous + drain", false, true, true},
                        {"(c) continuous + inflight", false, false, true},
                        {"(d) continuous, no updates", false, false, false}};
  // Interleave modes across repeats so machine noise hits all alike; keep
  // each mode's best run.
  // Also the ratios within each round (four runs back to back), whose
  // median is less sensitive to the load drifting between rounds.
  Result best[4];
  std::vector<double> round_ratios[3];  // (c)/(a), (c)/(b), (c)/(d)
  for (int r = 0; r < flags.repeat; ++r) {
    double tps[4];
    for (int m = 0; m < 4; ++m) {
      Result res =
          RunOnce(*loaded, versions, flags, lengths, modes[m].static_batching,
                  modes[m].drain, modes[m].updates,
                  LayoutOf(flags.kv_layout));
      tps[m] = res.tokens_per_second;
      if (res.tokens_per_second > best[m].tokens_per_second) best[m] = res;
    }
    round_ratios[0].push_back(tps[2] / tps[0]);
    round_ratios[1].push_back(tps[2] / tps[1]);
    round_ratios[2].push_back(tps[2] / tps[3]);
  }
  std::printf("%-28s %12s %10s %7s %9s %14s %14s\n", "mode", "tokens/s",
              "tokens", "steps", "updates", "pause p50 (s)", "pause p99 (s)");
  for (int m = 0; m < 4; ++m) {
    std::printf("%-28s %12.1f %10llu %7d %9d %14.2e %14.2e\n", modes[m].name,
                best[m].tokens_per_second,
                static_cast<unsigned long long>(best[m].tokens), best[m].steps,
                best[m].updates, Percentile(best[m].pauses, 0.5),
                Percentile(best[m].pauses, 0.99));
    if (best[m].overruns > 0) {
      std::printf("  warning: %d steps took longer than --flat-step-ms\n",
                  best[m].overruns);
    }
  }
  std::printf("ratios: (c)/(a) = %.2f   (c)/(b) = %.2f   (c)/(d) = %.2f\n",
              best[2].tokens_per_second / best[0].tokens_per_second,
              best[2].tokens_per_second / best[1].tokens_per_second,
              best[2].tokens_per_second / best[3].tokens_per_second);
  const char* names[] = {"(c)/(a)", "(c)/(b)", "(c)/(d)"};
  std::printf("per-round ratios over %d rounds (median [min, max]):",
              flags.repeat);
  for (int k = 0; k < 3; ++k) {
    const std::vector<double>& v = round_ratios[k];
    std::printf("  %s %.2f [%.2f, %.2f]", names[k], Percentile(v, 0.5),
                *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  }
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace tandem::engine

int main(int argc, char** argv) { return tandem::engine::Main(argc, argv); }
