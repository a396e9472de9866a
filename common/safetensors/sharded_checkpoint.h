#pragma once

// A model checkpoint directory in the Hugging Face layout: either one
// `model.safetensors`, or shards listed by `model.safetensors.index.json`:
//
//   {"metadata": {"total_size": 1234},
//    "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors",
//                   ...}}

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/safetensors/safetensors_file.h"
#include "common/safetensors/safetensors_writer.h"

namespace tandem::safetensors {

inline constexpr char kSingleFileName[] = "model.safetensors";
inline constexpr char kIndexFileName[] = "model.safetensors.index.json";

// All tensors of a checkpoint directory, each shard mapped once. Immutable
// after Open(), so safe to read from several threads. TensorView pointers
// stay valid while the ShardedCheckpoint lives.
class ShardedCheckpoint {
 public:
  // Opens `dir`. With an index file, every shard it names is opened once
  // and validated (see SafetensorsFile), and the index must match the
  // shards exactly: each tensor in the weight_map must be in the shard the
  // map names, and each tensor of a shard must be in the weight_map under
  // that shard. Shard names must be plain file names inside `dir`.
  // Without an index, `dir/model.safetensors` is the only shard.
  // Errors: NotFound when neither file exists; InvalidArgument naming the
  // file and the tensor or field for any inconsistency.
  static absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> Open(
      const std::string& dir);

  ShardedCheckpoint(const ShardedCheckpoint&) = delete;
  ShardedCheckpoint& operator=(const ShardedCheckpoint&) = delete;

  // The tensor called `name`, or nullptr.
  const TensorView* Find(absl::string_view name) const;

  // The tensor called `name`, or NotFound naming the directory and tensor.
  absl::StatusOr<const TensorView*> Get(absl::string_view name) const;

  // Every tensor of every shard, ordered by name.
  const std::vector<const TensorView*>& tensors() const { return tensors_; }

  // The shards, in the order of their file names.
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const {
    return shards_;
  }

  // The index's "metadata" object (e.g. total_size) as JSON text, or empty
  // without an index; the shards' own "__metadata__" is on each shard.
  const std::string& index_metadata_json() const {
    return index_metadata_json_;
  }

  // Sum of nbytes over all tensors.
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  ShardedCheckpoint() = default;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorView*, std::less<>> by_name_;
  std::vector<const TensorView*> tensors_;
  std::string index_metadata_json_;
  uint64_t total_bytes_ = 0;
};

// Writes `tensors` into `dir` (which must exist) as shards named
// "model-00001-of-0000N.safetensors" plus model.safetensors.index.json with
// "metadata": {"total_size": <sum of tensor bytes>}. Tensors go to shards in
// the given order; a shard is closed when the next tensor would push it
// past `max_shard_bytes` of tensor data, so only a single tensor larger
// than the limit makes a shard exceed it. Every shard carries `metadata` as
// its "__metadata__". The index is written last, and every file atomically,
// so a reader never sees an index naming a missing shard. An index is
// written even for a single shard. Errors as for WriteSafetensors, plus
// InvalidArgument for max_shard_bytes == 0.
absl::Status WriteShardedCheckpoint(
    const std::string& dir, absl::Span<const TensorToWrite> tensors,
    uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace tandem::safetensors
