#include "common/model/hf_checkpoint.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/torch_status.h"
#include "common/safetensors/atomic_file.h"
#include "common/safetensors/safetensors_writer.h"
#include "kernels/finite_scan.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;
using safetensors::DType;

constexpr const char* kTokenizerFiles[] = {"tokenizer.json",
                                           "tokenizer_config.json",
                                           "special_tokens_map.json",
                                           "vocab.json",
                                           "merges.txt",
                                           "added_tokens.json",
                                           "generation_config.json"};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::StatusOr<at::ScalarType> StoredScalarType(
    const safetensors::TensorView& t, const std::string& source) {
  switch (t.dtype) {
    case DType::kF32:
      return at::kFloat;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kF16:
      return at::kHalf;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor '", t.name, "' has dtype ",
                       safetensors::DTypeName(t.dtype),
                       "; model weights must be F32, BF16 or F16"));
  }
}

// The file that holds `view`: its shard's path, or `source` when no shard
// lists it (cannot happen for a view of `checkpoint`).
std::string FileOf(const safetensors::ShardedCheckpoint& checkpoint,
                   const safetensors::TensorView& view,
                   const std::string& source) {
  for (const auto& shard : checkpoint.shards()) {
    if (shard->Find(view.name) == &view) return shard->source();
  }
  return source;
}

// InvalidArgument naming the file, the tensor and the first non-finite
// element when `bytes` (the tensor's stored values) holds an Inf or a NaN:
// a checkpoint that would poison every forward pass is refused at load.
absl::Status CheckFinite(const safetensors::ShardedCheckpoint& checkpoint,
                         const safetensors::TensorView& view,
                         absl::Span<const uint8_t> bytes,
                         const std::string& source) {
  const kernels::FloatFormat format =
      view.dtype == DType::kF32    ? kernels::FloatFormat::kF32
      : view.dtype == DType::kBF16 ? kernels::FloatFormat::kBF16
                                   : kernels::FloatFormat::kF16;
  const std::optional<kernels::NonFiniteValue> bad =
      kernels::FindNonFinite(bytes, format);
  if (!bad.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      FileOf(checkpoint, view, source), ": tensor '", view.name, "' (",
      kernels::FloatFormatName(format), " ", ShapeString(view.shape),
      ") holds a non-finite value: element ", bad->index, " of ",
      view.numel(), " is ", kernels::NonFiniteName(*bad),
      "; refusing to load corrupt or diverged weights"));
}

DType ToSafetensorsDType(WeightDType dtype) {
  return dtype == WeightDType::kBFloat16 ? DType::kBF16 : DType::kF32;
}

bool IsIgnorableExtra(const std::string& name, const ModelConfig& config) {
  if (absl::EndsWith(name, "rotary_emb.inv_freq")) return true;
  return config.tie_word_embeddings && name == "lm_head.weight";
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  const absl::Span<const uint8_t> piece(
      reinterpret_cast<const uint8_t*>(text.data()), text.size());
  return safetensors::WriteFileAtomically(path, {&piece, 1});
}

absl::Status CopyFileAtomically(const std::string& from,
                                const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(from, ": cannot open"));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(from, ": read failed"));
  return WriteTextFile(to, bytes.str());
}

// Removes `dir`'s checkpoint files that are not in `keep`.
absl::Status RemoveStaleCheckpointFiles(const std::string& dir,
                                        const std::set<std::string>& keep) {
  static const std::regex kShard(R"(model-\d+-of-\d+\.safetensors)");
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool checkpoint_file = name == safetensors::kSingleFileName ||
                                 name == safetensors::kIndexFileName ||
                                 std::regex_match(name, kShard);
    if (checkpoint_file && keep.count(name) == 0) {
      fs::remove(entry.path(), ec);
      if (ec) {
        return absl::InternalError(
            absl::StrCat(entry.path().string(),
                         ": cannot remove stale file: ", ec.message()));
      }
    }
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat(dir, ": cannot list: ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<ModelWeights>> LoadWeights(
    const ModelConfig& config, const safetensors::ShardedCheckpoint& checkpoint,
    const std::string& source, const LoadOptions& options) {
  ModelConfig target_config = config;
  if (options.dtype.has_value()) target_config.dtype = *options.dtype;
  const at::ScalarType target = ToScalarType(target_config.dtype);
  const std::vector<ExpectedTensor> expected = ExpectedTensors(config);
  std::set<std::string> expected_names;
  // Check names and shapes of everything before copying anything.
  for (const ExpectedTensor& e : expected) {
    expected_names.insert(e.name);
    const safetensors::TensorView* view = checkpoint.Find(e.name);
    if (view == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor '", e.name, "' is missing (expected shape ",
          ShapeString(e.shape), ")"));
    }
    if (view->shape != e.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor '", e.name, "': expected shape ",
          ShapeString(e.shape), ", got ", ShapeString(view->shape)));
    }
    RETURN_IF_ERROR(StoredScalarType(*view, source).status());
  }
  for (const safetensors::TensorView* view : checkpoint.tensors()) {
    if (expected_names.count(view->name) == 0 &&
        !IsIgnorableExtra(view->name, config)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unexpected tensor '", view->name, "' for ",
                       ArchitectureName(config.architecture),
                       " with this config.json (num_hidden_layers ",
                       config.num_hidden_layers, ", tie_word_embeddings ",
                       config.tie_word_embeddings ? "true" : "false", ")"));
    }
  }
  std::map<std::string, at::Tensor> tensors;
  try {
    c10::NoGradGuard no_grad;
    for (const ExpectedTensor& e : expected) {
      const safetensors::TensorView* view = checkpoint.Find(e.name);
      ASSIGN_OR_RETURN(at::ScalarType stored, StoredScalarType(*view, source));
      // The mapped bytes have no alignment guarantee: copy into an owned
      // tensor first, then convert (a no-op when dtype and device match).
      at::Tensor staged =
          at::empty(view->shape, at::TensorOptions().dtype(stored));
      std::memcpy(staged.data_ptr(), view->data, view->nbytes);
      RETURN_IF_ERROR(CheckFinite(
          checkpoint, *view,
          {static_cast<const uint8_t*>(staged.data_ptr()), view->nbytes},
          source));
      tensors[e.name] = staged.to(options.device, target);
    }
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus(
        absl::StrCat(source, ": converting tensors"), e);
  }
  return ModelWeights::Create(std::move(target_config), std::move(tensors),
                              source);
}

absl::StatusOr<std::shared_ptr<ModelWeights>> LoadHfModel(
    const std::string& dir, const LoadOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<safetensors::ShardedCheckpoint> checkpoint,
                   safetensors::ShardedCheckpoint::Open(dir));
  return LoadWeights(config, *checkpoint, dir, options);
}

absl::Status SaveHfModel(const ModelWeights& weights, const std::string& dir,
                         const SaveOptions& options) {
  if (options.max_shard_bytes == 0) {
    return absl::InvalidArgumentError("SaveHfModel: max_shard_bytes is 0");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat(dir, ": cannot create directory: ", ec.message()));
  }
  const WeightDType dtype = options.dtype.value_or(weights.config().dtype);
  ModelConfig config = weights.config();
  config.dtype = dtype;

  // CPU, contiguous, in the stored dtype; kept alive while writing.
  std::vector<at::Tensor> host;
  std::vector<safetensors::TensorToWrite> to_write;
  uint64_t total_bytes = 0;
  try {
    c10::NoGradGuard no_grad;
    for (const ExpectedTensor& e : ExpectedTensors(config)) {
      at::Tensor t = weights.tensors()
                         .at(e.name)
                         .detach()
                         .to(at::kCPU, ToScalarType(dtype))
                         .contiguous();
      const size_t nbytes = t.numel() * t.element_size();
      total_bytes += nbytes;
      to_write.push_back({e.name,
                          ToSafetensorsDType(dtype),
                          e.shape,
                          {static_cast<const uint8_t*>(t.data_ptr()), nbytes}});
      host.push_back(std::move(t));
    }
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus(
        absl::StrCat(dir, ": copying weights to the host"), e);
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::set<std::string> written;
  if (total_bytes <= options.max_shard_bytes) {
    RETURN_IF_ERROR(safetensors::WriteSafetensors(
        absl::StrCat(dir, "/", safetensors::kSingleFileName), to_write,
        metadata));
    written.insert(safetensors::kSingleFileName);
  } else {
    RETURN_IF_ERROR(safetensors::WriteShardedCheckpoint(
        dir, to_write, options.max_shard_bytes, metadata));
    ASSIGN_OR_RETURN(auto checkpoint,
                     safetensors::ShardedCheckpoint::Open(dir));
    written.insert(safetensors::kIndexFileName);
    for (const auto& shard : checkpoint->shards()) {
      written.insert(fs::path(shard->source()).filename().string());
    }
  }
  host.clear();
  RETURN_IF_ERROR(RemoveStaleCheckpointFiles(dir, written));
  RETURN_IF_ERROR(WriteTextFile(absl::StrCat(dir, "/config.json"),
                                ModelConfigToJson(config).dump(2) + "\n"));
  if (!options.tokenizer_dir.empty() &&
      fs::path(options.tokenizer_dir) != fs::path(dir)) {
    for (const char* name : kTokenizerFiles) {
      const std::string from = absl::StrCat(options.tokenizer_dir, "/", name);
      if (!fs::exists(from)) continue;
      RETURN_IF_ERROR(CopyFileAtomically(from, absl::StrCat(dir, "/", name)));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::model
