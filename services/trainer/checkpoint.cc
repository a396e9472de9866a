#include "services/trainer/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/posix.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_weights.h"
#include "common/model/torch_status.h"
#include "common/safetensors/atomic_file.h"
#include "common/safetensors/mapped_file.h"
#include "common/safetensors/safetensors_file.h"
#include "common/safetensors/safetensors_writer.h"
#include "common/task/arith_tokenizer.h"
#include "kernels/crc32c.h"
#include "kernels/finite_scan.h"

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kFormat[] = "tandem-trainer-checkpoint";
constexpr int kFormatVersion = 1;
constexpr char kStepPrefix[] = "step-";
constexpr char kTmpPrefix[] = "tmp-";
constexpr char kPinnedPrefix[] = "pinned-";

auto Log() { return ComponentLogger("trainer"); }

// Step number of a "step-<N>" directory name, or -1.
int64_t StepOfName(const std::string& name) {
  if (!absl::StartsWith(name, kStepPrefix)) return -1;
  int64_t step = -1;
  if (!absl::SimpleAtoi(name.substr(std::strlen(kStepPrefix)), &step)) {
    return -1;
  }
  return step >= 0 ? step : -1;
}

std::string CpuRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  const at::Tensor state = gen.get_state();
  return std::string(reinterpret_cast<const char*>(state.data_ptr<uint8_t>()),
                     static_cast<size_t>(state.numel()));
}

absl::Status SetCpuRngState(const std::string& bytes) {
  try {
    at::Tensor state = at::empty({static_cast<int64_t>(bytes.size())},
                                 at::TensorOptions().dtype(at::kByte));
    std::memcpy(state.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  } catch (const std::exception& e) {
    return model::internal::TorchErrorToStatus("restoring the CPU RNG state",
                                               e);
  }
  return absl::OkStatus();
}

absl::Status WriteOptimizer(const GrpoTrainerState& state,
                            const std::string& path) {
  std::vector<at::Tensor> keep_alive;
  std::vector<safetensors::TensorToWrite> tensors;
  std::map<std::string, std::string> metadata = {
      {"format", "tandem-adamw"}, {"step", absl::StrCat(state.step)}};
  for (const auto& [name, m] : state.moments) {
    metadata[absl::StrCat("step/", name)] = absl::StrCat(m.step);
    using Entry = std::pair<const char*, const at::Tensor*>;
    for (const auto& [prefix, tensor] :
         {Entry{"exp_avg/", &m.exp_avg}, Entry{"exp_avg_sq/", &m.exp_avg_sq}}) {
      at::Tensor t = tensor->to(at::kFloat).contiguous().cpu();
      keep_alive.push_back(t);
      tensors.push_back({absl::StrCat(prefix, name), safetensors::DType::kF32,
                         t.sizes().vec(),
                         absl::Span<const uint8_t>(
                             static_cast<const uint8_t*>(t.data_ptr()),
                             static_cast<size_t>(t.numel()) * sizeof(float))});
    }
  }
  return safetensors::WriteSafetensors(path, tensors, metadata);
}

absl::StatusOr<std::map<std::string, AdamWMoments>> ReadOptimizer(
    const std::string& path) {
  ASSIGN_OR_RETURN(auto file, safetensors::SafetensorsFile::Open(path));
  const auto& metadata = file->metadata();
  auto format = metadata.find("format");
  if (format == metadata.end() || format->second != "tandem-adamw") {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": not an optimizer state file (metadata format is not "
                     "'tandem-adamw')"));
  }
  std::map<std::string, AdamWMoments> moments;
  for (const safetensors::TensorView& view : file->tensors()) {
    const bool first = absl::StartsWith(view.name, "exp_avg/");
    const bool second = absl::StartsWith(view.name, "exp_avg_sq/");
    if (!first && !second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": unexpected tensor '", view.name, "'"));
    }
    if (view.dtype != safetensors::DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", view.name, "' is not F32"));
    }
    const std::string name = view.name.substr(
        first ? std::strlen("exp_avg/") : std::strlen("exp_avg_sq/"));
    if (const std::optional<kernels::NonFiniteValue> bad =
            kernels::FindNonFinite(view.bytes(), kernels::FloatFormat::kF32)) {
      // NaN moments would make every later step's update NaN.
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", view.name, "' holds a non-finite value: "
          "element ", bad->index, " of ", view.numel(), " is ",
          kernels::NonFiniteName(*bad)));
    }
    at::Tensor t = at::empty(view.shape, at::TensorOptions().dtype(at::kFloat));
    if (view.nbytes > 0) std::memcpy(t.data_ptr(), view.data, view.nbytes);
    AdamWMoments& m = moments[name];
    (first ? m.exp_avg : m.exp_avg_sq) = t;
  }
  for (auto& [name, m] : moments) {
    if (!m.exp_avg.defined() || !m.exp_avg_sq.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": parameter '", name, "' lacks one of exp_avg / exp_avg_sq"));
    }
    auto step = metadata.find(absl::StrCat("step/", name));
    if (step == metadata.end() || !absl::SimpleAtoi(step->second, &m.step)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": metadata 'step/", name, "' is missing or not a number"));
    }
  }
  return moments;
}

// Every regular file under `root`, as paths relative to it.
absl::StatusOr<std::vector<std::string>> ListFiles(const std::string& root) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) {
      files.push_back(fs::relative(it->path(), root).string());
    }
  }
  if (ec) return FilesystemError(ec, root, "list");
  std::sort(files.begin(), files.end());
  return files;
}

bool IsPinned(const fs::path& checkpoint) {
  std::error_code ec;
  return fs::exists(checkpoint / kCheckpointPinFile, ec);
}

// Removes every unpinned step-* directory of `dir` but the newest `keep`
// (by step number), never `just_written`, and stale tmp-* directories.
void Prune(const std::string& dir, int64_t keep, const fs::path& just_written) {
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, kTmpPrefix)) {
      fs::remove_all(entry.path(), ec);
    } else if (int64_t step = StepOfName(name);
               step >= 0 && entry.is_directory() && !IsPinned(entry.path())) {
      steps.emplace_back(step, entry.path());
    }
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < steps.size(); ++i) {
    if (steps[i].second == just_written) continue;
    fs::remove_all(steps[i].second, ec);
  }
}

absl::Status PointLatest(const std::string& dir, const std::string& target) {
  const fs::path link = fs::path(dir) / kLatestCheckpointLink;
  const fs::path tmp = fs::path(dir) / ".latest.tmp";
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_directory_symlink(target, tmp, ec);
  if (ec) return FilesystemError(ec, tmp.string(), "create symlink");
  fs::rename(tmp, link, ec);
  if (ec) return FilesystemError(ec, link.string(), "replace symlink");
  return SyncDirectory(dir);
}

}  // namespace

absl::StatusOr<uint32_t> FileCrc32c(const std::string& path) {
  ASSIGN_OR_RETURN(auto mapped, safetensors::MappedFile::Open(path));
  return kernels::Crc32c(mapped->data(), mapped->size());
}

absl::StatusOr<WrittenCheckpoint> WriteCheckpoint(
    const GrpoTrainer& trainer, const CheckpointWriteOptions& options) {
  if (options.keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint keep must be >= 1, got ", options.keep));
  }
  const absl::Time start = absl::Now();
  WrittenCheckpoint written;
  written.step = trainer.step();
  written.policy_version = trainer.policy_version();
  const fs::path dir(options.dir);
  const std::string name = absl::StrCat(kStepPrefix, trainer.step());
  const fs::path final_path = dir / name;
  written.path = final_path.string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return FilesystemError(ec, dir.string(), "create directory");
  const fs::path tmp = dir / absl::StrCat(kTmpPrefix, trainer.step());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp / kCheckpointHfDir, ec);
  if (ec) return FilesystemError(ec, tmp.string(), "create directory");

  ASSIGN_OR_RETURN(std::shared_ptr<model::ModelWeights> weights,
                   trainer.SnapshotWeights());
  model::SaveOptions save;
  save.tokenizer_dir = options.tokenizer_dir;
  const std::string hf = (tmp / kCheckpointHfDir).string();
  RETURN_IF_ERROR(model::SaveHfModel(*weights, hf, save));
  if (options.builtin_tokenizer) {
    RETURN_IF_ERROR(task::WriteArithTokenizerFiles(hf));
  }
  ASSIGN_OR_RETURN(GrpoTrainerState state, trainer.CaptureState());
  RETURN_IF_ERROR(
      WriteOptimizer(state, (tmp / kCheckpointOptimizerFile).string()));

  json files = json::object();
  ASSIGN_OR_RETURN(std::vector<std::string> listed, ListFiles(tmp.string()));
  for (const std::string& file : listed) {
    const std::string full = (tmp / file).string();
    ASSIGN_OR_RETURN(uint32_t crc, FileCrc32c(full));
    const uint64_t size = fs::file_size(full, ec);
    if (ec) return FilesystemError(ec, full, "stat");
    files[file] = {{"bytes", size}, {"crc32c", crc}};
    written.bytes += size;
  }
  json config = json::parse(options.training_config_json, nullptr, false);
  if (config.is_discarded()) {
    return absl::InvalidArgumentError("training_config_json is not JSON");
  }
  const std::string config_text = config.dump();
  const json meta = {
      {"format", kFormat},
      {"format_version", kFormatVersion},
      {"step", state.step},
      {"policy_version", state.policy_version},
      {"schedule",
       {{"step", state.step},
        {"lr", trainer.LearningRate(std::max<int64_t>(state.step, 1))},
        {"base_lr", trainer.options().lr},
        {"warmup_steps", trainer.options().warmup_steps}}},
      {"cpu_rng_state", absl::Base64Escape(CpuRngState())},
      {"training_config", config},
      {"config_hash",
       absl::StrFormat(
           "%08x", kernels::Crc32c(config_text.data(), config_text.size()))},
      {"created_unix_ms", absl::ToUnixMillis(absl::Now())},
      {"files", files}};
  const std::string meta_text = meta.dump(2) + "\n";
  RETURN_IF_ERROR(safetensors::WriteFileAtomically(
      (tmp / kCheckpointStateFile).string(),
      {absl::Span<const uint8_t>(
          reinterpret_cast<const uint8_t*>(meta_text.data()),
          meta_text.size())}));
  written.bytes += meta_text.size();
  RETURN_IF_ERROR(SyncDirectory(hf));
  RETURN_IF_ERROR(SyncDirectory(tmp.string()));

  // A step-<step> already there (a trainer that restarted without resuming,
  // or a second save at one step) is replaced: moved aside, then removed.
  // A pinned one is kept under another name instead.
  if (fs::exists(final_path, ec) && IsPinned(final_path)) {
    const fs::path kept = dir / absl::StrCat(kPinnedPrefix, name, "-",
                                             absl::ToUnixMillis(absl::Now()));
    fs::rename(final_path, kept, ec);
    if (ec) {
      return FilesystemError(ec, final_path.string(),
                             "move pinned checkpoint");
    }
    Log()->warn(
        "{} was pinned and is replaced by a new checkpoint of the same "
        "step: the pinned one is kept as {}",
        final_path.string(), kept.string());
  }
  const fs::path replaced =
      dir / absl::StrCat(kTmpPrefix, trainer.step(), "-replaced");
  if (fs::exists(final_path, ec)) {
    fs::remove_all(replaced, ec);
    fs::rename(final_path, replaced, ec);
    if (ec) return FilesystemError(ec, final_path.string(), "move aside");
  }
  fs::rename(tmp, final_path, ec);
  if (ec)
    return FilesystemError(ec, final_path.string(), "rename from " + tmp.string());
  RETURN_IF_ERROR(SyncDirectory(dir.string()));
  RETURN_IF_ERROR(PointLatest(dir.string(), name));
  Prune(dir.string(), options.keep, final_path);
  written.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return written;
}

absl::Status PinCheckpoint(const std::string& path, absl::string_view reason) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) ||
      !fs::exists(fs::path(path) / kCheckpointStateFile, ec)) {
    return absl::NotFoundError(
        absl::StrCat(path, ": not a checkpoint directory, cannot pin it"));
  }
  const std::string text = absl::StrCat(reason, "\n");
  return safetensors::WriteFileAtomically(
      (fs::path(path) / kCheckpointPinFile).string(),
      {absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                 text.size())});
}

absl::StatusOr<std::string> FindLatestCheckpoint(const std::string& dir) {
  const fs::path link = fs::path(dir) / kLatestCheckpointLink;
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(link, ec);
  if (!fs::exists(status)) {
    return absl::NotFoundError(
        absl::StrCat(link.string(), ": no checkpoint to resume from"));
  }
  if (fs::is_symlink(status)) {
    const fs::path target = fs::read_symlink(link, ec);
    if (ec) return FilesystemError(ec, link.string(), "read symlink");
    const fs::path resolved =
        target.is_absolute() ? target : fs::path(dir) / target;
    if (!fs::is_directory(resolved, ec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          link.string(), " -> ", target.string(),
          ": the checkpoint it names does not exist (remove the link to "
          "start without resuming, or point it at a step-* directory)"));
    }
    return resolved.string();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      link.string(), ": expected a symlink to a step-* directory"));
}

absl::StatusOr<LoadedCheckpoint> ReadCheckpoint(const std::string& path) {
  LoadedCheckpoint loaded;
  loaded.path = path;
  loaded.hf_dir = (fs::path(path) / kCheckpointHfDir).string();
  const std::string meta_path =
      (fs::path(path) / kCheckpointStateFile).string();
  std::error_code ec;
  if (!fs::exists(meta_path, ec)) {
    return absl::DataLossError(absl::StrCat(
        meta_path, ": missing: the checkpoint is incomplete or corrupt"));
  }
  json meta;
  {
    absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> mapped =
        safetensors::MappedFile::Open(meta_path);
    if (!mapped.ok()) return mapped.status();
    meta = json::parse(
        reinterpret_cast<const char*>((*mapped)->data()),
        reinterpret_cast<const char*>((*mapped)->data()) + (*mapped)->size(),
        nullptr, false);
  }
  if (meta.is_discarded() || !meta.is_object()) {
    return absl::DataLossError(
        absl::StrCat(meta_path, ": not valid JSON: the checkpoint is corrupt"));
  }
  auto field = [&](const char* key, json::value_t type,
                   bool numeric = false) -> absl::StatusOr<const json*> {
    auto it = meta.find(key);
    const bool ok = it != meta.end() &&
                    (numeric ? it->is_number_integer() : it->type() == type);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(meta_path, ": field '",
                                                     key,
                                                     "' is missing or has the "
                                                     "wrong type"));
    }
    return &*it;
  };
  ASSIGN_OR_RETURN(const json* format, field("format", json::value_t::string));
  if (format->get<std::string>() != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(meta_path, ": format is '", format->get<std::string>(),
                     "', expected '", kFormat, "'"));
  }
  ASSIGN_OR_RETURN(
      const json* version,
      field("format_version", json::value_t::number_integer, true));
  if (version->get<int64_t>() != kFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        meta_path, ": format_version ", version->get<int64_t>(),
        " is not supported (this build reads ", kFormatVersion, ")"));
  }
  ASSIGN_OR_RETURN(const json* step,
                   field("step", json::value_t::number_integer, true));
  ASSIGN_OR_RETURN(
      const json* policy_version,
      field("policy_version", json::value_t::number_integer, true));
  ASSIGN_OR_RETURN(const json* rng,
                   field("cpu_rng_state", json::value_t::string));
  ASSIGN_OR_RETURN(const json* files, field("files", json::value_t::object));
  ASSIGN_OR_RETURN(const json* hash,
                   field("config_hash", json::value_t::string));
  ASSIGN_OR_RETURN(const json* config,
                   field("training_config", json::value_t::object));
  loaded.state.step = step->get<int64_t>();
  loaded.state.policy_version = policy_version->get<uint64_t>();
  loaded.config_hash = hash->get<std::string>();
  loaded.training_config_json = config->dump();
  if (!absl::Base64Unescape(rng->get<std::string>(), &loaded.cpu_rng_state)) {
    return absl::InvalidArgumentError(
        absl::StrCat(meta_path, ": cpu_rng_state is not base64"));
  }
  for (const std::string required :
       {std::string(kCheckpointOptimizerFile),
        absl::StrCat(kCheckpointHfDir, "/config.json")}) {
    if (!files->contains(required)) {
      return absl::InvalidArgumentError(
          absl::StrCat(meta_path, ": 'files' does not list ", required));
    }
  }
  for (const auto& [file, info] : files->items()) {
    const std::string full = (fs::path(path) / file).string();
    if (!info.is_object() || !info.contains("bytes") ||
        !info.contains("crc32c") || !info["bytes"].is_number_unsigned() ||
        !info["crc32c"].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          meta_path, ": files['", file, "'] needs bytes and crc32c"));
    }
    if (!fs::is_regular_file(full, ec)) {
      return absl::DataLossError(absl::StrCat(full, ": missing (listed in ",
                                              kCheckpointStateFile,
                                              "): the checkpoint is corrupt"));
    }
    const uint64_t size = fs::file_size(full, ec);
    const uint64_t expected_size = info["bytes"].get<uint64_t>();
    if (ec || size != expected_size) {
      return absl::DataLossError(absl::StrCat(
          full, ": ", size, " bytes, expected ", expected_size, " (",
          kCheckpointStateFile, "): the checkpoint is truncated or corrupt"));
    }
    ASSIGN_OR_RETURN(uint32_t crc, FileCrc32c(full));
    const uint32_t expected_crc = info["crc32c"].get<uint32_t>();
    if (crc != expected_crc) {
      return absl::DataLossError(absl::StrFormat(
          "%s: crc32c 0x%08x, expected 0x%08x (%s): the checkpoint is corrupt",
          full, crc, expected_crc, kCheckpointStateFile));
    }
  }
  ASSIGN_OR_RETURN(
      loaded.state.moments,
      ReadOptimizer((fs::path(path) / kCheckpointOptimizerFile).string()));
  return loaded;
}

absl::Status RestoreFromCheckpoint(const LoadedCheckpoint& checkpoint,
                                   GrpoTrainer* trainer) {
  absl::Status status = trainer->RestoreState(checkpoint.state);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(checkpoint.path, "/",
                                                    kCheckpointOptimizerFile,
                                                    ": ", status.message()));
  }
  return SetCpuRngState(checkpoint.cpu_rng_state);
}

}  // namespace tandem::trainer
