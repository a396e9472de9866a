#include "common/safetensors/sharded_checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/safetensors/atomic_file.h"
#include "common/safetensors/mapped_file.h"
#include "common/safetensors/strict_json.h"
#include "nlohmann/json.hpp"

namespace tandem::safetensors {
namespace {

using nlohmann::json;

std::string JoinPath(const std::string& dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Shards must live in the checkpoint directory itself, so that an index
// cannot make us map arbitrary files.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::string IndexDuplicateKeyMessage(const std::vector<std::string>& path,
                                     const std::string& key) {
  if (path.size() == 1 && path[0] == "weight_map") {
    return absl::StrCat("weight_map: duplicate tensor name '", key, "'");
  }
  if (path.empty()) return absl::StrCat("duplicate key '", key, "'");
  return absl::StrCat(absl::StrJoin(path, "."), ": duplicate key '", key, "'");
}

// Reads the index: fills `weight_map` (tensor -> shard file name) and
// `metadata_json`.
absl::Status ReadIndex(const std::string& index_path,
                       std::map<std::string, std::string>* weight_map,
                       std::string* metadata_json) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file,
                   MappedFile::Open(index_path));
  auto error = [&](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", message));
  };
  if (file->size() > kMaxHeaderBytes) {
    return error(absl::StrCat("index is ", file->size(),
                              " bytes, above the limit of ", kMaxHeaderBytes));
  }
  const absl::string_view text(reinterpret_cast<const char*>(file->data()),
                               file->size());
  ASSIGN_OR_RETURN(json index,
                   internal::ParseJsonRejectingDuplicateKeys(
                       text, index_path, "index", IndexDuplicateKeyMessage));
  if (!index.is_object()) {
    return error(
        absl::StrCat("index is a JSON ", index.type_name(), ", not an object"));
  }
  auto map_it = index.find("weight_map");
  if (map_it == index.end()) return error("missing 'weight_map'");
  if (!map_it->is_object()) {
    return error(absl::StrCat("'weight_map' is a JSON ", map_it->type_name(),
                              ", not an object"));
  }
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    if (!it.value().is_string()) {
      return error(absl::StrCat("weight_map: tensor '", it.key(),
                                "' maps to a JSON ", it.value().type_name(),
                                ", not a shard file name"));
    }
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (!IsPlainFileName(shard)) {
      return error(absl::StrCat("weight_map: tensor '", it.key(), "' maps to '",
                                shard,
                                "', which is not a file name in the "
                                "checkpoint directory"));
    }
    weight_map->emplace(it.key(), shard);
  }
  auto metadata_it = index.find("metadata");
  if (metadata_it != index.end()) {
    if (!metadata_it->is_object()) {
      return error(absl::StrCat("'metadata' is a JSON ",
                                metadata_it->type_name(), ", not an object"));
    }
    *metadata_json = metadata_it->dump();
  }
  return absl::OkStatus();
}

// Checks that the index and the shards agree in both directions.
absl::Status CheckIndexMatchesShards(
    const std::string& index_path,
    const std::map<std::string, std::string>& weight_map,
    const std::map<std::string, const SafetensorsFile*>& shard_by_name) {
  for (const auto& [tensor, shard] : weight_map) {
    const SafetensorsFile* file = shard_by_name.at(shard);
    if (file->Find(tensor) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": tensor '", tensor, "' is mapped to '",
                       shard, "', but that shard has no such tensor"));
    }
  }
  for (const auto& [shard, file] : shard_by_name) {
    for (const TensorView& tensor : file->tensors()) {
      auto it = weight_map.find(tensor.name);
      if (it == weight_map.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(file->source(), ": tensor '", tensor.name,
                         "' is not listed in ", index_path));
      }
      if (it->second != shard) {
        return absl::InvalidArgumentError(absl::StrCat(
            file->source(), ": tensor '", tensor.name, "' is also here, but ",
            index_path, " maps it to '", it->second, "'"));
      }
    }
  }
  return absl::OkStatus();
}

std::string ShardFileName(size_t index, size_t count) {
  auto pad = [](size_t n) {
    std::string digits = std::to_string(n);
    if (digits.size() < 5) digits.insert(0, 5 - digits.size(), '0');
    return digits;
  };
  return absl::StrCat("model-", pad(index), "-of-", pad(count), ".safetensors");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> ShardedCheckpoint::Open(
    const std::string& dir) {
  std::unique_ptr<ShardedCheckpoint> checkpoint(new ShardedCheckpoint());
  checkpoint->dir_ = dir;
  const std::string index_path = JoinPath(dir, kIndexFileName);
  const std::string single_path = JoinPath(dir, kSingleFileName);

  if (IsRegularFile(index_path)) {
    std::map<std::string, std::string> weight_map;
    RETURN_IF_ERROR(
        ReadIndex(index_path, &weight_map, &checkpoint->index_metadata_json_));
    std::map<std::string, const SafetensorsFile*> shard_by_name;
    for (const auto& [tensor, shard] : weight_map) {
      if (shard_by_name.count(shard) != 0) continue;
      auto file = SafetensorsFile::Open(JoinPath(dir, shard));
      if (!file.ok()) {
        return absl::Status(
            file.status().code(),
            absl::StrCat(file.status().message(), " (shard named by ",
                         index_path, " for tensor '", tensor, "')"));
      }
      shard_by_name.emplace(shard, file->get());
      checkpoint->shards_.push_back(*std::move(file));
    }
    RETURN_IF_ERROR(
        CheckIndexMatchesShards(index_path, weight_map, shard_by_name));
    std::sort(
        checkpoint->shards_.begin(), checkpoint->shards_.end(),
        [](const auto& a, const auto& b) { return a->source() < b->source(); });
  } else if (IsRegularFile(single_path)) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single_path));
    checkpoint->shards_.push_back(std::move(file));
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": neither ", kIndexFileName, " nor ", kSingleFileName, " found"));
  }

  // Names are unique across shards: the index check above guarantees it.
  for (const auto& shard : checkpoint->shards_) {
    for (const TensorView& tensor : shard->tensors()) {
      checkpoint->by_name_.emplace(tensor.name, &tensor);
      checkpoint->total_bytes_ += tensor.nbytes;
    }
  }
  checkpoint->tensors_.reserve(checkpoint->by_name_.size());
  for (const auto& [name, tensor] : checkpoint->by_name_) {
    checkpoint->tensors_.push_back(tensor);
  }
  return checkpoint;
}

const TensorView* ShardedCheckpoint::Find(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

absl::StatusOr<const TensorView*> ShardedCheckpoint::Get(
    absl::string_view name) const {
  const TensorView* tensor = Find(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": no tensor named '", name, "' in the checkpoint"));
  }
  return tensor;
}

absl::Status WriteShardedCheckpoint(
    const std::string& dir, absl::Span<const TensorToWrite> tensors,
    uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata) {
  if (max_shard_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": max_shard_bytes must be > 0"));
  }
  // Greedy split in the given order.
  std::vector<absl::Span<const TensorToWrite>> groups;
  size_t group_start = 0;
  uint64_t group_bytes = 0;
  uint64_t total_size = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t size = tensors[i].bytes.size();
    if (i > group_start && group_bytes + size > max_shard_bytes) {
      groups.push_back(tensors.subspan(group_start, i - group_start));
      group_start = i;
      group_bytes = 0;
    }
    group_bytes += size;
    total_size += size;
  }
  if (group_start < tensors.size()) {
    groups.push_back(tensors.subspan(group_start));
  }

  // Validate everything before writing anything, so that bad input leaves
  // the directory as it was.
  json weight_map = json::object();
  std::vector<std::string> shard_names;
  for (size_t g = 0; g < groups.size(); ++g) {
    shard_names.push_back(ShardFileName(g + 1, groups.size()));
    for (const TensorToWrite& tensor : groups[g]) {
      if (weight_map.contains(tensor.name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, ": duplicate tensor name '", tensor.name, "'"));
      }
      weight_map[tensor.name] = shard_names.back();
    }
    auto header = SafetensorsHeader(groups[g], metadata);
    if (!header.ok()) {
      return absl::Status(header.status().code(),
                          absl::StrCat(JoinPath(dir, shard_names.back()), ": ",
                                       header.status().message()));
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    RETURN_IF_ERROR(
        WriteSafetensors(JoinPath(dir, shard_names[g]), groups[g], metadata));
  }

  const json index = {{"metadata", {{"total_size", total_size}}},
                      {"weight_map", weight_map}};
  std::string text;
  try {
    text = index.dump(2);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": a tensor name is not valid UTF-8: ", e.what()));
  }
  text += "\n";
  const absl::Span<const uint8_t> piece(
      reinterpret_cast<const uint8_t*>(text.data()), text.size());
  return WriteFileAtomically(JoinPath(dir, kIndexFileName), {&piece, 1});
}

}  // namespace tandem::safetensors
