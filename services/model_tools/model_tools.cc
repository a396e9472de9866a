#include "services/model_tools/model_tools.h"

#include <torch/torch.h>

#include <istream>
#include <nlohmann/json.hpp>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_loader.h"
#include "common/model/torch_status.h"
#include "common/task/arith_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/generate_all.h"
#include "engine/torch_engine_model.h"

namespace tandem::model_tools {
namespace {

absl::StatusOr<model::LoadedModel> Load(const std::string& dir) {
  return model::LoadModel(dir, /*seed=*/1, /*torch_threads=*/0);
}

}  // namespace

absl::Status Tokenize(const std::string& model_dir, std::istream& in,
                      std::ostream& out) {
  ASSIGN_OR_RETURN(model::LoadedModel model, Load(model_dir));
  std::string line;
  while (std::getline(in, line)) {
    out << nlohmann::json(model.tokenizer->Encode(line)).dump() << "\n";
  }
  return absl::OkStatus();
}

absl::Status LogProbs(const std::string& model_dir, std::istream& in,
                      std::ostream& out) {
  ASSIGN_OR_RETURN(model::LoadedModel model, Load(model_dir));
  const int64_t vocab = model.decoder->weights()->config().vocab_size;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty()) continue;
    std::vector<int64_t> tokens;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      tokens = j.at("tokens").get<std::vector<int64_t>>();
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("input line ", line_no,
                       ": expected {\"tokens\": [ids...]}: ", e.what()));
    }
    for (int64_t t : tokens) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("input line ", line_no, ": token ", t, " outside [0, ",
                         vocab, ")"));
      }
    }
    std::vector<float> logprobs;
    if (tokens.size() >= 2) {
      const int64_t n = static_cast<int64_t>(tokens.size());
      ASSIGN_OR_RETURN(
          at::Tensor logits,
          model.decoder->ForwardPacked(
              torch::tensor(tokens, torch::kLong),
              torch::arange(n, torch::kLong),
              torch::tensor(std::vector<int64_t>{0, n}, torch::kLong)));
      try {
        const at::Tensor lp =
            torch::log_softmax(logits.to(torch::kFloat), -1).contiguous();
        const float* data = lp.data_ptr<float>();
        for (int64_t i = 1; i < n; ++i) {
          logprobs.push_back(data[(i - 1) * vocab + tokens[i]]);
        }
      } catch (const std::exception& e) {
        return model::internal::TorchErrorToStatus("logprobs", e);
      }
    }
    out << nlohmann::json{{"logprobs", logprobs}}.dump() << "\n";
  }
  return absl::OkStatus();
}

absl::Status Generate(const std::string& model_dir,
                      const GenerateOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(model::LoadedModel model, Load(model_dir));
  engine::TorchEngineModel engine_model(model.decoder, model.max_tokens);
  engine::GenerateAllOptions generate;
  generate.engine.eos_token_ids = model.eos_token_ids;
  generate.params.temperature = options.temperature;
  generate.params.seed = options.seed;
  generate.params.max_tokens = options.max_tokens;
  generate.max_sequence_tokens = model.max_tokens;
  const std::vector<std::vector<int32_t>> prompts = {
      model.tokenizer->Encode(options.prompt)};
  ASSIGN_OR_RETURN(std::vector<engine::FinishedSample> samples,
                   engine::GenerateAll(&engine_model, prompts, generate));
  for (const auto& sample : samples) {
    out << nlohmann::json{{"text",
                           model.tokenizer->Decode(sample.output, true)},
                          {"tokens", sample.output},
                          {"logprobs", sample.logprobs},
                          {"finish_reason",
                           engine::FinishReasonName(sample.finish_reason)}}
               .dump()
        << "\n";
  }
  return absl::OkStatus();
}

absl::Status Export(const std::string& model_dir, const std::string& out_dir) {
  ASSIGN_OR_RETURN(model::LoadedModel model, Load(model_dir));
  model::SaveOptions save;
  save.tokenizer_dir = model_dir;
  RETURN_IF_ERROR(model::SaveHfModel(*model.decoder->weights(), out_dir, save));
  if (model_dir.empty()) {
    RETURN_IF_ERROR(task::WriteArithTokenizerFiles(out_dir));
  }
  return absl::OkStatus();
}

}  // namespace tandem::model_tools
