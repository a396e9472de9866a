#include "services/trainer/tools/sft/sft_trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_weights.h"
#include "common/model/torch_status.h"
#include "common/safetensors/atomic_file.h"
#include "common/task/arith_task.h"
#include "common/task/arith_tokenizer.h"
#include "common/task/tools_demonstration.h"
#include "common/task/tools_task.h"
#include "common/task/tools_tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/trainer/tools/sft/sft_data.h"
#include "services/trainer/tools/sft/sft_eval.h"
#include "services/trainer/tools/sft/tools_eval.h"

namespace tandem::trainer::sft {
namespace {

namespace fs = std::filesystem;

constexpr char kMetaFile[] = "sft_meta.json";
constexpr char kCurveFile[] = "sft_curve.csv";
// Bumped when a change to training makes old checkpoints not reusable.
constexpr int kMetaVersion = 1;

const char* ScheduleName(LrSchedule schedule) {
  return schedule == LrSchedule::kCosine ? "cosine" : "constant";
}

// Everything that determines the trained weights: the cache key.
// The arithmetic task's key has no "task" field, so its cached warm starts
// stay valid.
nlohmann::json OptionsJson(const SftOptions& o) {
  nlohmann::json key = {{"version", kMetaVersion},
                        {"digits", o.digits},
                        {"subtraction", o.subtraction},
                        {"seed", o.seed},
                        {"max_steps", o.max_steps},
                        {"batch_size", o.batch_size},
                        {"lr", o.lr},
                        {"warmup_steps", o.warmup_steps},
                        {"schedule", ScheduleName(o.schedule)},
                        {"min_lr_ratio", o.min_lr_ratio},
                        {"weight_decay", o.weight_decay},
                        {"grad_clip", o.grad_clip},
                        {"eval_every", o.eval_every},
                        {"eval_problems", o.eval_problems},
                        {"target_accuracy", o.target_accuracy},
                        {"max_accuracy", o.max_accuracy}};
  if (o.task != "arith") key["task"] = o.task;
  return key;
}

absl::Status WriteTokenizerFiles(const SftOptions& o) {
  return o.task == "tools" ? task::WriteToolsTokenizerFiles(o.output_dir)
                           : task::WriteArithTokenizerFiles(o.output_dir);
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  const auto* data = reinterpret_cast<const uint8_t*>(text.data());
  const absl::Span<const uint8_t> piece(data, text.size());
  return safetensors::WriteFileAtomically(path, {piece});
}

bool HasCheckpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / "config.json", ec) &&
         fs::exists(dir / "tokenizer.json", ec) &&
         (fs::exists(dir / "model.safetensors", ec) ||
          fs::exists(dir / "model.safetensors.index.json", ec));
}

// The result recorded in a matching finished directory, if any.
std::optional<SftResult> CachedResult(const SftOptions& options) {
  const fs::path dir(options.output_dir);
  std::ifstream in(dir / kMetaFile);
  if (!in || !HasCheckpoint(dir)) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json meta =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() ||
      meta.value("options", nlohmann::json()) != OptionsJson(options)) {
    return std::nullopt;
  }
  SftResult result;
  result.from_cache = true;
  result.reached_target = meta.value("reached_target", false);
  result.saved_step = meta.value("saved_step", int64_t{0});
  result.saved_accuracy = meta.value("saved_accuracy", 0.0);
  result.train_seconds = meta.value("train_seconds", 0.0);
  return result;
}

double LearningRate(const SftOptions& o, int64_t step) {
  if (o.warmup_steps > 0 && step <= o.warmup_steps) {
    return o.lr * static_cast<double>(step) / o.warmup_steps;
  }
  if (o.schedule == LrSchedule::kConstant || o.max_steps <= o.warmup_steps) {
    return o.lr;
  }
  const double progress = static_cast<double>(step - o.warmup_steps) /
                          static_cast<double>(o.max_steps - o.warmup_steps);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * cosine);
}

std::map<std::string, at::Tensor> Snapshot(const model::ModelWeights& w) {
  torch::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> copy;
  for (const auto& [name, tensor] : w.tensors()) {
    copy[name] = tensor.detach().clone();
  }
  return copy;
}

struct BestSnapshot {
  int64_t step = -1;
  double accuracy = -1.0;
  std::map<std::string, at::Tensor> tensors;
};

absl::Status SaveOutputs(const SftOptions& options,
                         const model::ModelConfig& config,
                         const BestSnapshot& best, const SftResult& result) {
  ASSIGN_OR_RETURN(
      std::shared_ptr<model::ModelWeights> weights,
      model::ModelWeights::Create(config, best.tensors,
                                  absl::StrCat("sft step ", best.step)));
  const fs::path dir(options.output_dir);
  RETURN_IF_ERROR(model::SaveHfModel(*weights, dir.string()));
  RETURN_IF_ERROR(WriteTokenizerFiles(options));
  std::string csv = "step,loss,heldout_accuracy,seconds\n";
  for (const SftCurvePoint& p : result.curve) {
    absl::StrAppendFormat(&csv, "%d,%.6f,%.4f,%.2f\n", p.step, p.loss,
                          p.heldout_accuracy, p.seconds);
  }
  RETURN_IF_ERROR(WriteText((dir / kCurveFile).string(), csv));
  const nlohmann::json meta = {{"options", OptionsJson(options)},
                               {"reached_target", result.reached_target},
                               {"saved_step", result.saved_step},
                               {"saved_accuracy", result.saved_accuracy},
                               {"train_seconds", result.train_seconds}};
  return WriteText((dir / kMetaFile).string(), meta.dump(2) + "\n");
}

// What the training loop needs of a task: the model's shape, the train
// stream's examples and the held-out accuracy.
struct SftTask {
  model::ModelConfig config;
  std::function<absl::StatusOr<SftExample>(uint64_t index)> train_example;
  std::function<absl::StatusOr<double>(const model::DecoderModel&)> evaluate;
};

absl::StatusOr<SftTask> MakeSftTask(const SftOptions& options) {
  SftTask out;
  if (options.task == "tools") {
    task::ToolsTaskOptions task_options;
    task_options.digits = options.digits;
    task_options.seed = options.seed;
    ASSIGN_OR_RETURN(const task::ToolsTask tools,
                     task::ToolsTask::Create(task_options));
    ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                     task::LoadToolsTokenizer());
    ASSIGN_OR_RETURN(chat::ChatTemplate tmpl,
                     chat::ChatTemplate::Parse(task::ToolsChatTemplate(),
                                               "tools chat_template"));
    auto shared_tokenizer =
        std::shared_ptr<const tokenizer::Tokenizer>(std::move(tokenizer));
    out.config = ToolsTinyModelConfig();
    out.train_example = [tools, shared_tokenizer,
                         tmpl](uint64_t index) -> absl::StatusOr<SftExample> {
      ASSIGN_OR_RETURN(const task::ToolsDemonstration demo,
                       task::MakeToolsDemonstration(
                           *shared_tokenizer, tmpl,
                           tools.Sample(task::Split::kTrain, index)));
      return MakeToolsSftExample(demo);
    };
    const std::vector<task::ToolsProblem> heldout =
        tools.Take(task::Split::kHeldOut, options.eval_problems);
    out.evaluate =
        [heldout, shared_tokenizer,
         tmpl](const model::DecoderModel& model) -> absl::StatusOr<double> {
      ASSIGN_OR_RETURN(
          const ToolsEvalResult eval,
          EvaluateToolsEpisodes(model, *shared_tokenizer, tmpl, heldout));
      return eval.accuracy();
    };
    return out;
  }
  task::ArithTaskOptions task_options;
  task_options.digits = options.digits;
  task_options.subtraction = options.subtraction;
  task_options.seed = options.seed;
  ASSIGN_OR_RETURN(const task::ArithTask arith,
                   task::ArithTask::Create(task_options));
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                   task::LoadArithTokenizer());
  auto shared_tokenizer =
      std::shared_ptr<const tokenizer::Tokenizer>(std::move(tokenizer));
  out.config = TinyModelConfig(shared_tokenizer->vocab_size());
  out.train_example =
      [arith, shared_tokenizer](uint64_t index) -> absl::StatusOr<SftExample> {
    return MakeSftExample(*shared_tokenizer,
                          arith.Sample(task::Split::kTrain, index));
  };
  const std::vector<task::ArithProblem> heldout =
      arith.Take(task::Split::kHeldOut, options.eval_problems);
  const int digits = options.digits;
  out.evaluate =
      [heldout, shared_tokenizer,
       digits](const model::DecoderModel& model) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(
        const EvalResult eval,
        EvaluateExactMatch(model, *shared_tokenizer, heldout, digits));
    return eval.accuracy();
  };
  return out;
}

// The training loop proper; may throw c10::Error (RunSft catches).
absl::StatusOr<SftResult> Train(
    const SftOptions& options,
    const std::function<void(const SftCurvePoint&)>& on_eval) {
  if (options.threads > 0) torch::set_num_threads(options.threads);
  torch::manual_seed(options.seed);
  ASSIGN_OR_RETURN(const SftTask task, MakeSftTask(options));
  const model::ModelConfig& config = task.config;
  ASSIGN_OR_RETURN(std::shared_ptr<model::ModelWeights> weights,
                   model::RandomInit(config, options.seed));
  std::vector<at::Tensor> params;
  for (const auto& [name, tensor] : weights->tensors()) {
    tensor.requires_grad_(true);
    params.push_back(tensor);
  }
  const model::DecoderModel model(weights);
  torch::optim::AdamW optimizer(params,
                                torch::optim::AdamWOptions(options.lr)
                                    .betas({0.9, 0.95})
                                    .weight_decay(options.weight_decay));

  SftResult result;
  BestSnapshot best;
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0.0;
  int64_t loss_steps = 0;
  bool stop = false;
  for (int64_t step = 0; step <= options.max_steps && !stop; ++step) {
    if (step > 0) {
      std::vector<SftExample> examples;
      examples.reserve(options.batch_size);
      const uint64_t first =
          static_cast<uint64_t>((step - 1) * options.batch_size);
      for (int64_t i = 0; i < options.batch_size; ++i) {
        ASSIGN_OR_RETURN(SftExample example, task.train_example(first + i));
        examples.push_back(std::move(example));
      }
      ASSIGN_OR_RETURN(const PackedBatch batch, PackExamples(examples));
      const double lr = LearningRate(options, step);
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      }
      ASSIGN_OR_RETURN(const at::Tensor logits,
                       model.ForwardPacked(batch.input_ids, batch.position_ids,
                                           batch.cu_seqlens));
      const at::Tensor loss = torch::nn::functional::cross_entropy(
          logits.index_select(0, batch.loss_positions).to(torch::kFloat32),
          batch.loss_targets);
      optimizer.zero_grad();
      loss.backward();
      if (options.grad_clip > 0) {
        torch::nn::utils::clip_grad_norm_(params, options.grad_clip);
      }
      optimizer.step();
      loss_sum += loss.item<double>();
      ++loss_steps;
    }
    const bool last = step == options.max_steps;
    if (step % options.eval_every != 0 && !last) continue;

    ASSIGN_OR_RETURN(const double heldout_accuracy, task.evaluate(model));
    SftCurvePoint point;
    point.step = step;
    point.loss = loss_steps > 0 ? loss_sum / loss_steps
                                : std::numeric_limits<double>::quiet_NaN();
    point.heldout_accuracy = heldout_accuracy;
    point.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    loss_sum = 0.0;
    loss_steps = 0;
    result.curve.push_back(point);
    if (on_eval) on_eval(point);

    const double acc = point.heldout_accuracy;
    if (acc <= options.max_accuracy && acc > best.accuracy) {
      best.step = step;
      best.accuracy = acc;
      best.tensors = Snapshot(*weights);
    }
    if (acc >= options.target_accuracy) {
      result.reached_target = acc <= options.max_accuracy;
      stop = true;
    }
  }
  result.train_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  result.saved_step = best.step;
  result.saved_accuracy = best.accuracy;
  RETURN_IF_ERROR(SaveOutputs(options, config, best, result));
  return result;
}

}  // namespace

model::ModelConfig TinyModelConfig(int64_t vocab_size) {
  model::ModelConfig c = model::BuiltinTinyModelConfig(vocab_size);
  c.bos_token_id = task::kArithBosId;
  c.eos_token_ids = {task::kArithEosId};
  return c;
}

model::ModelConfig ToolsTinyModelConfig() {
  model::ModelConfig c = model::BuiltinTinyModelConfig(task::kToolsVocabSize);
  c.bos_token_id = std::nullopt;
  c.eos_token_ids = {task::kToolsImEndId};
  c.max_position_embeddings = 256;
  return c;
}

absl::Status ValidateSftOptions(const SftOptions& o) {
  auto bad = [](absl::string_view name, const auto& value,
                absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat("sft: ", name, " must be ", want, ", got ", value));
  };
  if (o.output_dir.empty()) return bad("--output", "\"\"", "a directory");
  if (o.task != "arith" && o.task != "tools") {
    return bad("--task", o.task, "arith or tools");
  }
  if (o.digits < 1 || o.digits > 9)
    return bad("--digits", o.digits, "in [1, 9]");
  if (o.task == "tools" && o.digits < 2) {
    return bad("--digits", o.digits, "in [2, 9] for --task tools");
  }
  if (o.max_steps < 1) return bad("--steps", o.max_steps, ">= 1");
  if (o.batch_size < 1) return bad("--batch-size", o.batch_size, ">= 1");
  if (!(o.lr > 0)) return bad("--lr", o.lr, "> 0");
  if (o.warmup_steps < 0) return bad("--warmup-steps", o.warmup_steps, ">= 0");
  if (o.min_lr_ratio < 0 || o.min_lr_ratio > 1) {
    return bad("--min-lr-ratio", o.min_lr_ratio, "in [0, 1]");
  }
  if (o.weight_decay < 0) return bad("--weight-decay", o.weight_decay, ">= 0");
  if (o.eval_every < 1) return bad("--eval-every", o.eval_every, ">= 1");
  if (o.eval_problems < 1) {
    return bad("--eval-problems", o.eval_problems, ">= 1");
  }
  if (o.target_accuracy < 0 || o.target_accuracy > 1) {
    return bad("--target-accuracy", o.target_accuracy, "in [0, 1]");
  }
  if (o.max_accuracy < o.target_accuracy || o.max_accuracy > 1) {
    return bad(
        "--max-accuracy", o.max_accuracy,
        absl::StrCat("in [target-accuracy (", o.target_accuracy, "), 1]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SftResult> RunSft(
    const SftOptions& options,
    const std::function<void(const SftCurvePoint&)>& on_eval) {
  RETURN_IF_ERROR(ValidateSftOptions(options));
  if (std::optional<SftResult> cached = CachedResult(options)) {
    // Caches written before tokenizer_config.json existed get it now, so
    // that `transformers` finds the special tokens in every cached start.
    RETURN_IF_ERROR(WriteTokenizerFiles(options));
    return *std::move(cached);
  }
  // A stale meta must not vouch for a half-rewritten directory.
  std::error_code ec;
  fs::remove(fs::path(options.output_dir) / kMetaFile, ec);
  try {
    return Train(options, on_eval);
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("sft training", e);
  }
}

}  // namespace tandem::trainer::sft
