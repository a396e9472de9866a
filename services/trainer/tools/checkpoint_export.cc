#include "services/trainer/tools/checkpoint_export.h"

#include <filesystem>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_loader.h"
#include "common/task/arith_tokenizer.h"
#include "services/trainer/checkpoint.h"

namespace tandem::trainer {

absl::StatusOr<std::string> ExportCheckpoint(const ExportOptions& options) {
  model::WeightDType dtype;
  if (options.dtype == "float32") {
    dtype = model::WeightDType::kFloat32;
  } else if (options.dtype == "bfloat16") {
    dtype = model::WeightDType::kBFloat16;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype must be float32 or bfloat16, got '", options.dtype, "'"));
  }
  if (options.builtin) {
    ASSIGN_OR_RETURN(model::LoadedModel builtin,
                     model::LoadModel("", options.seed, 0));
    model::SaveOptions save;
    save.dtype = dtype;
    RETURN_IF_ERROR(
        model::SaveHfModel(*builtin.decoder->weights(), options.output, save));
    RETURN_IF_ERROR(task::WriteArithTokenizerFiles(options.output));
    return builtin.description;
  }
  std::string path = options.checkpoint;
  std::error_code ec;
  if (std::filesystem::exists(
          std::filesystem::path(path) / kLatestCheckpointLink, ec)) {
    ASSIGN_OR_RETURN(path, FindLatestCheckpoint(path));
  }
  ASSIGN_OR_RETURN(LoadedCheckpoint checkpoint, ReadCheckpoint(path));
  model::LoadOptions load;
  load.dtype = dtype;
  ASSIGN_OR_RETURN(std::shared_ptr<model::ModelWeights> weights,
                   model::LoadHfModel(checkpoint.hf_dir, load));
  model::SaveOptions save;
  save.dtype = dtype;
  save.tokenizer_dir = checkpoint.hf_dir;
  RETURN_IF_ERROR(model::SaveHfModel(*weights, options.output, save));
  return path;
}

int RunExportCommand(int argc, char** argv) {
  ExportOptions options;
  CLI::App app{
      "Writes the policy of a trainer checkpoint as a Hugging Face model "
      "directory (config.json, model.safetensors, tokenizer files)."};
  CLI::Option* checkpoint = app.add_option(
      "--checkpoint", options.checkpoint,
      "A step-* checkpoint, or a checkpoint_dir (exports latest)");
  CLI::Option* builtin = app.add_flag(
      "--builtin", options.builtin,
      "Export the built-in tiny model (random weights from --seed, the "
      "arithmetic tokenizer) instead of a checkpoint");
  checkpoint->excludes(builtin);
  app.add_option("--seed", options.seed, "Seed of the --builtin model")
      ->capture_default_str();
  app.add_option("--output", options.output, "Output directory")->required();
  app.add_option("--dtype", options.dtype, "float32 or bfloat16")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (options.checkpoint.empty() && !options.builtin) {
    std::cerr << "tandem-trainer export: one of --checkpoint and --builtin "
                 "is required\n";
    return 2;
  }
  absl::StatusOr<std::string> exported = ExportCheckpoint(options);
  if (!exported.ok()) {
    std::cerr << "tandem-trainer export: " << exported.status().message()
              << "\n";
    return 1;
  }
  std::cout << "exported " << *exported << " to " << options.output << "\n";
  return 0;
}

}  // namespace tandem::trainer
