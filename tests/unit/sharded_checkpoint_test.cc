// Sharded checkpoint directories: writing, loading, and index/shard
// mismatches.

#include "common/safetensors/sharded_checkpoint.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/unit/safetensors_test_util.h"

namespace tandem::safetensors {
namespace {

using testing::PatternBytes;
using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

// Ten F32 tensors "layer.<i>.weight" of 4 * (i + 1) elements.
struct TenTensors {
  TenTensors() {
    for (int i = 0; i < 10; ++i) {
      buffers.push_back(PatternBytes(16 * (i + 1), static_cast<uint8_t>(i)));
    }
    for (int i = 0; i < 10; ++i) {
      tensors.push_back({absl::StrCat("layer.", i, ".weight"),
                         DType::kF32,
                         {4, i + 1},
                         buffers[i]});
    }
  }
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorToWrite> tensors;
};

std::string OpenError(const std::string& dir) {
  auto checkpoint = ShardedCheckpoint::Open(dir);
  REQUIRE_FALSE(checkpoint.ok());
  return std::string(checkpoint.status().message());
}

TEST_CASE("Sharded write splits by max shard size and loads back",
          "[safetensors]") {
  TempDir dir;
  TenTensors input;  // 16, 32, ..., 160 bytes: 880 in all.
  REQUIRE(WriteShardedCheckpoint(dir.path(), input.tensors,
                                 /*max_shard_bytes=*/200, {{"format", "pt"}})
              .ok());

  const nlohmann::json index =
      nlohmann::json::parse(ReadBytes(dir.File(kIndexFileName)));
  CHECK(index["metadata"]["total_size"] == 880);
  CHECK(index["weight_map"].size() == 10);
  CHECK(index["weight_map"]["layer.0.weight"] ==
        "model-00001-of-00006.safetensors");
  CHECK(std::filesystem::exists(dir.File("model-00006-of-00006.safetensors")));

  auto checkpoint = ShardedCheckpoint::Open(dir.path());
  REQUIRE(checkpoint.ok());
  CHECK((*checkpoint)->shards().size() == 6);
  CHECK((*checkpoint)->total_bytes() == 880);
  CHECK((*checkpoint)->index_metadata_json() == R"({"total_size":880})");
  for (const auto& shard : (*checkpoint)->shards()) {
    uint64_t shard_bytes = 0;
    for (const TensorView& t : shard->tensors()) shard_bytes += t.nbytes;
    CHECK((shard_bytes <= 200 || shard->tensors().size() == 1));
    CHECK(shard->metadata().at("format") == "pt");
  }
  REQUIRE((*checkpoint)->tensors().size() == 10);
  for (size_t i = 1; i < 10; ++i) {
    CHECK((*checkpoint)->tensors()[i - 1]->name <
          (*checkpoint)->tensors()[i]->name);
  }
  for (int i = 0; i < 10; ++i) {
    auto view = (*checkpoint)->Get(absl::StrCat("layer.", i, ".weight"));
    REQUIRE(view.ok());
    CHECK((*view)->shape == std::vector<int64_t>{4, i + 1});
    REQUIRE((*view)->nbytes == input.buffers[i].size());
    CHECK(std::memcmp((*view)->data, input.buffers[i].data(),
                      input.buffers[i].size()) == 0);
  }
  auto missing = (*checkpoint)->Get("nope");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains(dir.path()) && Catch::Contains("'nope'"));
}

TEST_CASE("A tensor larger than the shard limit gets a shard of its own",
          "[safetensors]") {
  TempDir dir;
  TenTensors input;
  REQUIRE(WriteShardedCheckpoint(dir.path(), input.tensors, 1).ok());
  auto checkpoint = ShardedCheckpoint::Open(dir.path());
  REQUIRE(checkpoint.ok());
  CHECK((*checkpoint)->shards().size() == 10);
}

TEST_CASE("Sharded write with a large limit writes one shard and an index",
          "[safetensors]") {
  TempDir dir;
  TenTensors input;
  REQUIRE(WriteShardedCheckpoint(dir.path(), input.tensors, 1 << 20).ok());
  CHECK(std::filesystem::exists(dir.File("model-00001-of-00001.safetensors")));
  auto checkpoint = ShardedCheckpoint::Open(dir.path());
  REQUIRE(checkpoint.ok());
  CHECK((*checkpoint)->shards().size() == 1);
  CHECK((*checkpoint)->tensors().size() == 10);
}

TEST_CASE("Sharded write rejects bad input before writing any file",
          "[safetensors]") {
  TempDir dir;
  TenTensors input;
  input.tensors.push_back(input.tensors.front());
  const absl::Status duplicate =
      WriteShardedCheckpoint(dir.path(), input.tensors, 64);
  CHECK_THAT(std::string(duplicate.message()),
             Catch::Contains("duplicate tensor name 'layer.0.weight'"));
  CHECK(std::filesystem::is_empty(dir.path()));
  CHECK(WriteShardedCheckpoint(dir.path(), input.tensors, 0).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("A directory with only model.safetensors opens as one shard",
          "[safetensors]") {
  TempDir dir;
  TenTensors input;
  REQUIRE(WriteSafetensors(dir.File(kSingleFileName), input.tensors).ok());
  auto checkpoint = ShardedCheckpoint::Open(dir.path());
  REQUIRE(checkpoint.ok());
  CHECK((*checkpoint)->shards().size() == 1);
  CHECK((*checkpoint)->tensors().size() == 10);
  CHECK((*checkpoint)->index_metadata_json().empty());
  CHECK((*checkpoint)->Find("layer.3.weight") != nullptr);
}

TEST_CASE("A directory without checkpoint files is NotFound", "[safetensors]") {
  TempDir dir;
  auto checkpoint = ShardedCheckpoint::Open(dir.path());
  REQUIRE_FALSE(checkpoint.ok());
  CHECK(checkpoint.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(checkpoint.status().message()),
             Catch::Contains(dir.path()) && Catch::Contains(kIndexFileName));
}

TEST_CASE("An index naming a tensor its shard lacks is rejected",
          "[safetensors]") {
  TempDir dir;
  const std::vector<uint8_t> bytes = PatternBytes(4, 0);
  REQUIRE(WriteSafetensors(dir.File("a.safetensors"),
                           {{"x", DType::kU8, {4}, bytes}})
              .ok());
  WriteBytes(dir.File(kIndexFileName),
             R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}})");
  CHECK_THAT(OpenError(dir.path()),
             Catch::Contains(dir.File(kIndexFileName)) &&
                 Catch::Contains("tensor 'y' is mapped to 'a.safetensors', "
                                 "but that shard has no such tensor"));
}

TEST_CASE("A shard tensor missing from the index is rejected",
          "[safetensors]") {
  TempDir dir;
  const std::vector<uint8_t> bytes = PatternBytes(4, 0);
  REQUIRE(WriteSafetensors(dir.File("a.safetensors"),
                           {{"x", DType::kU8, {2}, {bytes.data(), 2}},
                            {"stray", DType::kU8, {2}, {bytes.data(), 2}}})
              .ok());
  WriteBytes(dir.File(kIndexFileName),
             R"({"weight_map": {"x": "a.safetensors"}})");
  CHECK_THAT(OpenError(dir.path()),
             Catch::Contains(dir.File("a.safetensors")) &&
                 Catch::Contains("tensor 'stray' is not listed in"));
}

TEST_CASE("A tensor present in two shards is rejected", "[safetensors]") {
  TempDir dir;
  const std::vector<uint8_t> bytes = PatternBytes(2, 0);
  REQUIRE(WriteSafetensors(dir.File("a.safetensors"),
                           {{"x", DType::kU8, {2}, bytes}})
              .ok());
  REQUIRE(WriteSafetensors(
              dir.File("b.safetensors"),
              {{"x", DType::kU8, {2}, bytes}, {"y", DType::kU8, {2}, bytes}})
              .ok());
  WriteBytes(dir.File(kIndexFileName),
             R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  CHECK_THAT(OpenError(dir.path()),
             Catch::Contains(dir.File("b.safetensors")) &&
                 Catch::Contains("tensor 'x' is also here, but") &&
                 Catch::Contains("maps it to 'a.safetensors'"));
}

TEST_CASE("A missing shard is NotFound naming shard and index",
          "[safetensors]") {
  TempDir dir;
  WriteBytes(dir.File(kIndexFileName),
             R"({"weight_map": {"x": "gone.safetensors"}})");
  auto checkpoint = ShardedCheckpoint::Open(dir.path());
  REQUIRE_FALSE(checkpoint.ok());
  CHECK(checkpoint.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(checkpoint.status().message()),
             Catch::Contains(dir.File("gone.safetensors")) &&
                 Catch::Contains("tensor 'x'"));
}

TEST_CASE("A malformed shard is reported with the shard's path",
          "[safetensors]") {
  TempDir dir;
  WriteBytes(dir.File("a.safetensors"), "short");
  WriteBytes(dir.File(kIndexFileName),
             R"({"weight_map": {"x": "a.safetensors"}})");
  CHECK_THAT(OpenError(dir.path()),
             Catch::StartsWith(dir.File("a.safetensors") + ": file is 5"));
}

TEST_CASE("Malformed index files are rejected naming the field",
          "[safetensors]") {
  TempDir dir;
  const std::string index = dir.File(kIndexFileName);
  WriteBytes(index, "{not json");
  CHECK_THAT(
      OpenError(dir.path()),
      Catch::Contains(index) && Catch::Contains("index is not valid JSON"));
  WriteBytes(index, "[]");
  CHECK_THAT(OpenError(dir.path()),
             Catch::Contains("index is a JSON array, not an object"));
  WriteBytes(index, R"({"metadata": {}})");
  CHECK_THAT(OpenError(dir.path()), Catch::Contains("missing 'weight_map'"));
  WriteBytes(index, R"({"weight_map": []})");
  CHECK_THAT(OpenError(dir.path()),
             Catch::Contains("'weight_map' is a JSON array, not an object"));
  WriteBytes(index, R"({"weight_map": {"x": 3}})");
  CHECK_THAT(OpenError(dir.path()),
             Catch::Contains("weight_map: tensor 'x' maps to a JSON number"));
  WriteBytes(index, R"({"weight_map": {"x": "a", "x": "b"}})");
  CHECK_THAT(OpenError(dir.path()),
             Catch::Contains("weight_map: duplicate tensor name 'x'"));
  WriteBytes(index, R"({"weight_map": {}, "metadata": 5})");
  CHECK_THAT(OpenError(dir.path()),
             Catch::Contains("'metadata' is a JSON number, not an object"));
}

TEST_CASE("Shard names that leave the checkpoint directory are rejected",
          "[safetensors]") {
  TempDir dir;
  for (const char* shard : {"../model.safetensors", "/etc/passwd", "..", ""}) {
    WriteBytes(dir.File(kIndexFileName),
               absl::StrCat(R"({"weight_map": {"x": ")", shard, R"("}})"));
    CHECK_THAT(OpenError(dir.path()),
               Catch::Contains(absl::StrCat("tensor 'x' maps to '", shard,
                                            "', which is not a file name")));
  }
}

}  // namespace
}  // namespace tandem::safetensors
