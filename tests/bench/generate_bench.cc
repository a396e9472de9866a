// Generation throughput of the rollout engine on a Hugging Face model
// directory, for the race against llama.cpp and transformers
// (tests/bench/peer_engines.py). Prints one JSON line per case:
//
//   {"engine":"tandem","case":"decode","dtype":"float32","batch":8,
//    "prompt_tokens":32,"new_tokens":32,"threads":2,"tokens":248,
//    "seconds":...,"tokens_per_second":...,"runs":[...]}
//
//   generate_bench --model DIR [--dtype float32|bfloat16] [--threads T]
//                  [--device cpu|cuda|cuda:N]
//                  [--batch B[,B...]] [--prompt-tokens P] [--new-tokens C]
//                  [--prefill-tokens N] [--repeat R] [--prompt-ids a,b,...]
//                  [--paths LINEAR/SAMPLING[,...]]
//                  [--kv-layout auto|contiguous|paged]
//                  [--paged-attention auto|gather|kernel]
//
// --kv-layout and --paged-attention are engine.kv_layout and
// engine.paged_attention (TorchEngineModelOptions); by default the engine's
// own defaults: kv_layout auto, which pages (the pool is sized like the
// engine's BlockManager), and the engine's paged attention. Each JSON line
// names the resolved "kv_layout" and "paged_attention".
//
// decode: B requests of the same P-token prompt (separate requests, so each
// prefills its own copy, as the peers do), all admitted together, greedy,
// exactly C new tokens each (no end-of-sequence token stops a sample). The
// clock runs over the steps in which every scheduled chunk is a one-token
// decode, so the prefill is excluded; tokens = B * (C - 1) sampled there.
// prefill: one request of N prompt tokens computed in one step (with its
// first sampled token); tokens/s = N / that step's time.
// Each case first runs once unmeasured (warm-up: allocator, thread pool,
// LibTorch's first-call paths), then R times; the best run is reported and
// every run is listed. --prompt-ids gives the prompt (cycled to the length
// needed), so that every engine in the race decodes the same tokens.
// --paths measures several compute paths side by side in one process, runs
// alternating (path A, path B, A, B, ...), one JSON line per path and case
// with a "path" field: LINEAR is linear | weight-left | row-kernel | auto
// (model::LinearMode: at::linear, (W x^T)^T, kernels::RowGemmF32, or the
// default rule) and
// SAMPLING is host | tensor | auto (engine::SampleWhere: logits copied to
// the host and sampled there, sampled in LibTorch on the [B, vocab] tensor,
// or the default). E.g. --paths linear/host,auto/auto compares the old
// path with the default one.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/device.h"
#include "common/model/torch_device.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_weights.h"
#include "common/model/paged_attention.h"
#include "engine/engine.h"
#include "engine/torch_engine_model.h"

namespace tandem::engine {
namespace {

struct Flags {
  std::string model;
  std::string dtype = "float32";
  std::string device = "cpu";
  int threads = 2;
  std::vector<int> batches = {1, 8, 32};
  int prompt_tokens = 32;
  int new_tokens = 32;
  int prefill_tokens = 512;
  int repeat = 2;
  std::vector<int32_t> prompt_ids;
  std::vector<std::string> paths;  // empty: the defaults, no "path" field
  KvLayout kv_layout = KvLayout::kAuto;
  model::PagedAttention paged_attention =
      TorchEngineModelOptions().paged_attention;
};

// The engine model of one run: `path`'s sampling, the flags' KV layout and
// paged attention, a pool sized like the engine's blocks.
TorchEngineModelOptions ModelOptions(const Flags& flags, SampleWhere sampling,
                                     const EngineOptions& options) {
  TorchEngineModelOptions out;
  out.sampling = sampling;
  out.kv_layout = flags.kv_layout;
  out.kv_blocks = options.num_kv_blocks;
  out.block_size = options.block_size;
  out.paged_attention = flags.paged_attention;
  return out;
}

// One compute path: a decoder with its linear mode, and where to sample.
struct Path {
  std::string name;
  std::shared_ptr<model::DecoderModel> decoder;
  SampleWhere sampling = SampleWhere::kAuto;
};

struct Run {
  uint64_t tokens = 0;
  double seconds = 0;
  double tokens_per_second() const {
    return seconds > 0 ? tokens / seconds : 0;
  }
};

std::vector<int32_t> Prompt(const Flags& flags, int length, int vocab) {
  std::vector<int32_t> out;
  for (int i = 0; i < length; ++i) {
    out.push_back(flags.prompt_ids.empty()
                      ? static_cast<int32_t>((1000 + 7919 * i) % vocab)
                      : flags.prompt_ids[i % flags.prompt_ids.size()]);
  }
  return out;
}

// One decode run: `batch` requests of `prompt`, `new_tokens` each.
absl::StatusOr<Run> Decode(const Flags& flags, const Path& path,
                           int64_t max_tokens,
                           const std::vector<int32_t>& prompt, int batch,
                           int new_tokens) {
  EngineOptions options;
  options.limits.max_num_seqs = batch;
  // Every prompt fits in the first step: all sequences decode together.
  options.limits.max_batched_tokens =
      std::max<int32_t>(4096, batch * static_cast<int32_t>(prompt.size()));
  options.block_size = 16;
  options.num_kv_blocks =
      batch * ((static_cast<int>(prompt.size()) + new_tokens) / 16 + 2);
  TorchEngineModel torch_model(path.decoder, max_tokens,
                               ModelOptions(flags, path.sampling, options));
  // eos_token_ids stays empty: samples run to max_tokens.
  Engine engine(options, &torch_model, nullptr, 0);
  for (int i = 0; i < batch; ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = new_tokens;
    RETURN_IF_ERROR(engine.Add(absl::StrCat("r", i), prompt, p));
  }
  Run run;
  while (!engine.idle()) {
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(StepStats step, engine.Step());
    const absl::Duration took = absl::Now() - start;
    if (step.prefill_tokens == 0) {
      run.tokens += step.decode_tokens;
      run.seconds += absl::ToDoubleSeconds(took);
    }
    engine.TakeFinished();
  }
  return run;
}

// One prefill run: a single request of `prompt`, one new token.
absl::StatusOr<Run> Prefill(const Flags& flags, const Path& path,
                            int64_t max_tokens,
                            const std::vector<int32_t>& prompt) {
  EngineOptions options;
  options.limits.max_num_seqs = 1;
  options.limits.max_batched_tokens =
      std::max<int32_t>(4096, static_cast<int32_t>(prompt.size()));
  options.block_size = 16;
  options.num_kv_blocks = static_cast<int>(prompt.size()) / 16 + 4;
  TorchEngineModel torch_model(path.decoder, max_tokens,
                               ModelOptions(flags, path.sampling, options));
  Engine engine(options, &torch_model, nullptr, 0);
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 1;
  RETURN_IF_ERROR(engine.Add("prefill", prompt, p));
  Run run;
  while (!engine.idle()) {
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(StepStats step, engine.Step());
    run.seconds += absl::ToDoubleSeconds(absl::Now() - start);
    run.tokens += step.prefill_tokens;
    engine.TakeFinished();
  }
  return run;
}

void PrintCase(const Flags& flags, const std::string& path, const char* name,
               int batch, int prompt, int new_tokens,
               const std::vector<Run>& runs) {
  const Run best = *std::max_element(
      runs.begin(), runs.end(), [](const Run& a, const Run& b) {
        return a.tokens_per_second() < b.tokens_per_second();
      });
  std::vector<std::string> each;
  for (const Run& r : runs) {
    each.push_back(absl::StrCat(r.tokens_per_second()));
  }
  const std::string path_field =
      path.empty() ? "" : absl::StrCat("\"path\":\"", path, "\",");
  std::printf(
      "{\"engine\":\"tandem\",%s\"case\":\"%s\",\"device\":\"%s\","
      "\"dtype\":\"%s\",\"kv_layout\":\"%s\",\"paged_attention\":\"%s\","
      "\"batch\":%d,"
      "\"prompt_tokens\":%d,\"new_tokens\":%d,\"threads\":%d,\"tokens\":%llu,"
      "\"seconds\":%.6f,\"tokens_per_second\":%.3f,\"runs\":[%s]}\n",
      path_field.c_str(), name, flags.device.c_str(), flags.dtype.c_str(),
      flags.kv_layout == KvLayout::kContiguous ? "contiguous" : "paged",
      model::PagedAttentionName(flags.paged_attention), batch, prompt,
      new_tokens, flags.threads,
      static_cast<unsigned long long>(best.tokens), best.seconds,
      best.tokens_per_second(), absl::StrJoin(each, ",").c_str());
  std::fflush(stdout);
}

bool ParseInts(const std::string& text, std::vector<int>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) return false;
    out->push_back(v);
  }
  return !out->empty();
}

// The paths of --paths (or the one default path), all on `weights`.
absl::StatusOr<std::vector<Path>> MakePaths(
    const std::vector<std::string>& specs,
    std::shared_ptr<model::ModelWeights> weights) {
  std::vector<Path> out;
  for (const std::string& spec :
       specs.empty() ? std::vector<std::string>{"auto/auto"} : specs) {
    const std::vector<std::string> parts = absl::StrSplit(spec, '/');
    model::DecoderOptions options;
    Path path;
    path.name = spec;
    bool ok = parts.size() == 2;
    if (ok) {
      if (parts[0] == "linear") {
        options.linear = model::LinearMode::kLinear;
      } else if (parts[0] == "weight-left") {
        options.linear = model::LinearMode::kWeightLeft;
      } else if (parts[0] == "row-kernel") {
        options.linear = model::LinearMode::kRowKernel;
      } else {
        ok = parts[0] == "auto";
      }
      if (parts[1] == "host") {
        path.sampling = SampleWhere::kHost;
      } else if (parts[1] == "tensor") {
        path.sampling = SampleWhere::kDevice;
      } else {
        ok = ok && parts[1] == "auto";
      }
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("--paths: '", spec,
                       "' is not LINEAR/SAMPLING with LINEAR "
                       "linear|weight-left|row-kernel|auto and SAMPLING "
                       "host|tensor|auto"));
    }
    path.decoder = std::make_shared<model::DecoderModel>(weights, options);
    out.push_back(std::move(path));
  }
  return out;
}

absl::Status Main(const Flags& flags) {
  at::set_num_threads(flags.threads);
  model::LoadOptions load;
  if (flags.dtype == "float32") {
    load.dtype = model::WeightDType::kFloat32;
  } else if (flags.dtype == "bfloat16") {
    load.dtype = model::WeightDType::kBFloat16;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype must be float32 or bfloat16, got '", flags.dtype, "'"));
  }
  ASSIGN_OR_RETURN(const model::DeviceName device,
                   model::ResolveDevice("--device", flags.device));
  load.device = model::TorchDevice(device);
  ASSIGN_OR_RETURN(std::shared_ptr<model::ModelWeights> weights,
                   model::LoadHfModel(flags.model, load));
  const int vocab = static_cast<int>(weights->config().vocab_size);
  const int64_t max_tokens = weights->config().max_position_embeddings;
  ASSIGN_OR_RETURN(const std::vector<Path> paths,
                   MakePaths(flags.paths, std::move(weights)));
  const size_t n = paths.size();
  const auto name = [&](size_t i) {
    return flags.paths.empty() ? std::string() : paths[i].name;
  };

  const std::vector<int32_t> prompt =
      Prompt(flags, flags.prompt_tokens, vocab);
  for (int batch : flags.batches) {
    // Warm-up, not measured: a short run of the same shape.
    for (const Path& path : paths) {
      RETURN_IF_ERROR(
          Decode(flags, path, max_tokens, prompt, batch,
                 std::min(4, flags.new_tokens))
              .status());
    }
    std::vector<std::vector<Run>> runs(n);
    for (int r = 0; r < flags.repeat; ++r) {
      for (size_t i = 0; i < n; ++i) {
        ASSIGN_OR_RETURN(Run run, Decode(flags, paths[i], max_tokens, prompt,
                                         batch, flags.new_tokens));
        runs[i].push_back(run);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      PrintCase(flags, name(i), "decode", batch, flags.prompt_tokens,
                flags.new_tokens, runs[i]);
    }
  }
  if (flags.prefill_tokens > 0) {
    const std::vector<int32_t> long_prompt =
        Prompt(flags, flags.prefill_tokens, vocab);
    for (const Path& path : paths) {
      RETURN_IF_ERROR(Prefill(flags, path, max_tokens, long_prompt).status());
    }
    std::vector<std::vector<Run>> runs(n);
    for (int r = 0; r < flags.repeat; ++r) {
      for (size_t i = 0; i < n; ++i) {
        ASSIGN_OR_RETURN(Run run,
                         Prefill(flags, paths[i], max_tokens, long_prompt));
        runs[i].push_back(run);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      PrintCase(flags, name(i), "prefill", 1, flags.prefill_tokens, 1, runs[i]);
    }
  }
  return absl::OkStatus();
}

int ParseAndRun(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", f.c_str());
      return 2;
    }
    const std::string v = argv[i + 1];
    bool ok = true;
    if (f == "--model") {
      flags.model = v;
    } else if (f == "--dtype") {
      flags.dtype = v;
    } else if (f == "--device") {
      flags.device = v;
    } else if (f == "--batch") {
      ok = ParseInts(v, &flags.batches);
    } else if (f == "--kv-layout") {
      ok = v == "auto" || v == "contiguous" || v == "paged";
      flags.kv_layout = v == "contiguous" ? KvLayout::kContiguous
                        : v == "paged"    ? KvLayout::kPaged
                                          : KvLayout::kAuto;
    } else if (f == "--paged-attention") {
      auto parsed = model::ParsePagedAttention(v);
      ok = parsed.ok();
      if (ok) flags.paged_attention = *parsed;
    } else if (f == "--paths") {
      flags.paths = absl::StrSplit(v, ',');
    } else if (f == "--prompt-ids") {
      std::vector<int> ids;
      ok = ParseInts(v, &ids);
      flags.prompt_ids.assign(ids.begin(), ids.end());
    } else {
      int* target = f == "--threads"          ? &flags.threads
                    : f == "--prompt-tokens"  ? &flags.prompt_tokens
                    : f == "--new-tokens"     ? &flags.new_tokens
                    : f == "--prefill-tokens" ? &flags.prefill_tokens
                    : f == "--repeat"         ? &flags.repeat
                                              : nullptr;
      if (target == nullptr) {
        std::fprintf(stderr, "unknown flag %s\n", f.c_str());
        return 2;
      }
      ok = absl::SimpleAtoi(v, target) &&
           (*target > 0 || (f == "--prefill-tokens" && *target == 0));
    }
    if (!ok) {
      std::fprintf(stderr, "bad value for %s: '%s'\n", f.c_str(), v.c_str());
      return 2;
    }
  }
  if (flags.model.empty()) {
    std::fprintf(stderr, "--model DIR is required\n");
    return 2;
  }
  if (flags.new_tokens < 2) {
    std::fprintf(stderr, "--new-tokens must be >= 2 (decode steps)\n");
    return 2;
  }
  absl::Status status = Main(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "generate_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem::engine

int main(int argc, char** argv) {
  return tandem::engine::ParseAndRun(argc, argv);
}
