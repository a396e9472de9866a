// Round trips and API behaviour of the safetensors reader and writer.
// Malformed inputs are in safetensors_malformed_test.cc, sharded
// checkpoints in sharded_checkpoint_test.cc.

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors/dtype.h"
#include "common/safetensors/safetensors_file.h"
#include "common/safetensors/safetensors_writer.h"
#include "tests/unit/safetensors_test_util.h"

namespace tandem::safetensors {
namespace {

using testing::PatternBytes;
using testing::ReadBytes;
using testing::TempDir;

absl::Span<const uint8_t> AsSpan(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST_CASE("DType names round trip through ParseDType for every dtype",
          "[safetensors]") {
  for (DType dtype : kAllDTypes) {
    auto parsed = ParseDType(DTypeName(dtype));
    REQUIRE(parsed.ok());
    CHECK(*parsed == dtype);
  }
  CHECK(DTypeName(DType::kF8E4M3) == "F8_E4M3");
  CHECK(DTypeName(DType::kBF16) == "BF16");
}

TEST_CASE("DTypeSize matches the element width of each dtype",
          "[safetensors]") {
  CHECK(DTypeSize(DType::kBool) == 1);
  CHECK(DTypeSize(DType::kU8) == 1);
  CHECK(DTypeSize(DType::kI8) == 1);
  CHECK(DTypeSize(DType::kF8E4M3) == 1);
  CHECK(DTypeSize(DType::kF8E5M2) == 1);
  CHECK(DTypeSize(DType::kU16) == 2);
  CHECK(DTypeSize(DType::kI16) == 2);
  CHECK(DTypeSize(DType::kF16) == 2);
  CHECK(DTypeSize(DType::kBF16) == 2);
  CHECK(DTypeSize(DType::kU32) == 4);
  CHECK(DTypeSize(DType::kI32) == 4);
  CHECK(DTypeSize(DType::kF32) == 4);
  CHECK(DTypeSize(DType::kF64) == 8);
  CHECK(DTypeSize(DType::kU64) == 8);
  CHECK(DTypeSize(DType::kI64) == 8);
}

TEST_CASE("ParseDType rejects unknown and lower-case names", "[safetensors]") {
  auto unknown = ParseDType("F33");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(unknown.status().message()),
             Catch::Contains("unknown dtype 'F33'"));
  CHECK_FALSE(ParseDType("f32").ok());
}

TEST_CASE("CheckedNumBytes multiplies dims and detects overflow",
          "[safetensors]") {
  CHECK(*CheckedNumBytes({}, 4) == 4);
  CHECK(*CheckedNumBytes({2, 3}, 8) == 48);
  CHECK(*CheckedNumBytes({int64_t{1} << 62, int64_t{1} << 62, 0}, 8) == 0);
  CHECK(CheckedNumBytes({int64_t{1} << 32, int64_t{1} << 32}, 1)
            .status()
            .code() == absl::StatusCode::kOutOfRange);
  CHECK(CheckedNumBytes({int64_t{1} << 62}, 8).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(CheckedNumBytes({2, -1}, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Every dtype round trips through WriteSafetensors and Open",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.File("all_dtypes.safetensors");
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorToWrite> tensors;
  for (DType dtype : kAllDTypes) {
    const std::vector<int64_t> shape = {2, 3};
    buffers.push_back(
        PatternBytes(6 * DTypeSize(dtype), static_cast<uint8_t>(dtype)));
    tensors.push_back(TensorToWrite{absl::StrCat("t_", DTypeName(dtype)), dtype,
                                    shape, buffers.back()});
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"step", "42"}};
  REQUIRE(WriteSafetensors(path, tensors, metadata).ok());
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));

  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK((*file)->source() == path);
  CHECK((*file)->metadata() == metadata);
  REQUIRE((*file)->tensors().size() == kAllDTypes.size());
  for (size_t i = 0; i < kAllDTypes.size(); ++i) {
    const DType dtype = kAllDTypes[i];
    auto view = (*file)->Get(absl::StrCat("t_", DTypeName(dtype)));
    REQUIRE(view.ok());
    CHECK((*view)->dtype == dtype);
    CHECK((*view)->shape == std::vector<int64_t>{2, 3});
    CHECK((*view)->numel() == 6);
    REQUIRE((*view)->nbytes == buffers[i].size());
    CHECK(std::memcmp((*view)->data, buffers[i].data(), buffers[i].size()) ==
          0);
  }
}

TEST_CASE("Writer pads the header so the data buffer is 8-byte aligned",
          "[safetensors]") {
  for (size_t name_length = 1; name_length <= 16; ++name_length) {
    const std::vector<uint8_t> bytes = PatternBytes(4, 1);
    const std::vector<TensorToWrite> tensors = {
        {std::string(name_length, 'x'), DType::kF32, {1}, bytes}};
    auto serialized = SerializeSafetensors(tensors);
    REQUIRE(serialized.ok());
    auto file = SafetensorsFile::FromBuffer(AsSpan(*serialized), "buffer");
    REQUIRE(file.ok());
    CHECK(((*file)->header_size() + 8) % 8 == 0);
    CHECK(serialized->size() == 8 + (*file)->header_size() + 4);
  }
}

TEST_CASE("Scalars, empty tensors and a file without tensors round trip",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.File("edge.safetensors");
  const std::vector<uint8_t> scalar = PatternBytes(8, 3);
  const std::vector<TensorToWrite> tensors = {
      {"scalar", DType::kF64, {}, scalar},
      {"empty", DType::kF32, {0, 4}, {}},
      {"also_empty", DType::kBF16, {3, 0}, {}}};
  REQUIRE(WriteSafetensors(path, tensors).ok());
  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK((*file)->metadata().empty());
  const TensorView* s = (*file)->Find("scalar");
  REQUIRE(s != nullptr);
  CHECK(s->shape.empty());
  CHECK(s->numel() == 1);
  CHECK(std::memcmp(s->data, scalar.data(), 8) == 0);
  const TensorView* e = (*file)->Find("empty");
  REQUIRE(e != nullptr);
  CHECK(e->nbytes == 0);
  CHECK(e->shape == std::vector<int64_t>{0, 4});

  const std::string none_path = dir.File("none.safetensors");
  REQUIRE(WriteSafetensors(none_path, {}).ok());
  auto none = SafetensorsFile::Open(none_path);
  REQUIRE(none.ok());
  CHECK((*none)->tensors().empty());
}

TEST_CASE("Tensors are listed in data-buffer order", "[safetensors]") {
  const std::vector<uint8_t> a = PatternBytes(4, 1), b = PatternBytes(8, 2);
  const std::vector<TensorToWrite> tensors = {{"z_first", DType::kU8, {4}, a},
                                              {"a_second", DType::kU8, {8}, b}};
  auto serialized = SerializeSafetensors(tensors);
  REQUIRE(serialized.ok());
  auto file = SafetensorsFile::FromBuffer(AsSpan(*serialized), "buffer");
  REQUIRE(file.ok());
  REQUIRE((*file)->tensors().size() == 2);
  CHECK((*file)->tensors()[0].name == "z_first");
  CHECK((*file)->tensors()[1].name == "a_second");
}

TEST_CASE("FromBuffer views the caller's bytes without copying",
          "[safetensors]") {
  const std::vector<uint8_t> bytes = PatternBytes(16, 9);
  auto serialized = SerializeSafetensors({{"w", DType::kI32, {4}, bytes}});
  REQUIRE(serialized.ok());
  auto file = SafetensorsFile::FromBuffer(AsSpan(*serialized), "in-memory");
  REQUIRE(file.ok());
  const TensorView* w = (*file)->Find("w");
  REQUIRE(w != nullptr);
  const auto* begin = reinterpret_cast<const uint8_t*>(serialized->data());
  CHECK(w->data >= begin);
  CHECK(w->data + w->nbytes == begin + serialized->size());
}

TEST_CASE("Get on a missing tensor is NotFound naming file and tensor",
          "[safetensors]") {
  auto serialized = SerializeSafetensors({});
  REQUIRE(serialized.ok());
  auto file = SafetensorsFile::FromBuffer(AsSpan(*serialized), "ckpt.st");
  REQUIRE(file.ok());
  CHECK((*file)->Find("nope") == nullptr);
  auto missing = (*file)->Get("nope");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("ckpt.st") && Catch::Contains("'nope'"));
}

TEST_CASE("Views stay valid after the file is replaced on disk",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  const std::vector<uint8_t> old_bytes = PatternBytes(64, 1);
  REQUIRE(WriteSafetensors(path, {{"w", DType::kU8, {64}, old_bytes}}).ok());
  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  const std::vector<uint8_t> new_bytes = PatternBytes(64, 100);
  REQUIRE(WriteSafetensors(path, {{"w", DType::kU8, {64}, new_bytes}}).ok());
  const TensorView* w = (*file)->Find("w");
  REQUIRE(w != nullptr);
  CHECK(std::memcmp(w->data, old_bytes.data(), 64) == 0);
  auto reopened = SafetensorsFile::Open(path);
  REQUIRE(reopened.ok());
  CHECK(std::memcmp((*reopened)->Find("w")->data, new_bytes.data(), 64) == 0);
}

TEST_CASE("Writer rejects a byte span of the wrong size", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.File("bad.safetensors");
  const std::vector<uint8_t> bytes = PatternBytes(10, 0);
  const absl::Status status =
      WriteSafetensors(path, {{"lm_head.weight", DType::kF32, {2, 2}, bytes}});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains(path) && Catch::Contains("'lm_head.weight'") &&
                 Catch::Contains("needs 16 bytes, got 10"));
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_CASE("Writer rejects duplicate and reserved tensor names",
          "[safetensors]") {
  const std::vector<uint8_t> bytes = PatternBytes(1, 0);
  auto duplicate = SerializeSafetensors(
      {{"a", DType::kU8, {1}, bytes}, {"a", DType::kU8, {1}, bytes}});
  REQUIRE_FALSE(duplicate.ok());
  CHECK_THAT(std::string(duplicate.status().message()),
             Catch::Contains("duplicate tensor name 'a'"));
  auto reserved =
      SerializeSafetensors({{"__metadata__", DType::kU8, {1}, bytes}});
  REQUIRE_FALSE(reserved.ok());
  CHECK_THAT(std::string(reserved.status().message()),
             Catch::Contains("reserved"));
}

TEST_CASE("Writer rejects negative dimensions and invalid UTF-8 names",
          "[safetensors]") {
  auto negative = SerializeSafetensors({{"n", DType::kU8, {-1}, {}}});
  REQUIRE_FALSE(negative.ok());
  CHECK_THAT(std::string(negative.status().message()),
             Catch::Contains("'n'") && Catch::Contains("negative"));
  auto utf8 = SerializeSafetensors({{"bad\xff", DType::kU8, {0}, {}}});
  REQUIRE_FALSE(utf8.ok());
  CHECK_THAT(std::string(utf8.status().message()), Catch::Contains("UTF-8"));
}

TEST_CASE("Writer into a missing directory fails without crashing",
          "[safetensors]") {
  TempDir dir;
  const absl::Status status =
      WriteSafetensors(dir.File("no/such/dir/x.safetensors"), {});
  CHECK(status.code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(status.message()), Catch::Contains("no/such/dir"));
}

TEST_CASE("Every truncation of a valid file is rejected, never a crash",
          "[safetensors]") {
  const std::vector<uint8_t> a = PatternBytes(12, 1), b = PatternBytes(6, 2);
  auto serialized = SerializeSafetensors(
      {{"a", DType::kF32, {3}, a}, {"b", DType::kI16, {3}, b}},
      {{"format", "pt"}});
  REQUIRE(serialized.ok());
  for (size_t length = 0; length < serialized->size(); ++length) {
    // A copy of exactly `length` bytes, so sanitizers see any overread.
    const std::vector<uint8_t> prefix(serialized->begin(),
                                      serialized->begin() + length);
    auto file = SafetensorsFile::FromBuffer(prefix, "truncated");
    CHECK_FALSE(file.ok());
  }
  CHECK(SafetensorsFile::FromBuffer(AsSpan(*serialized), "whole").ok());
}

TEST_CASE("Open on a missing path is NotFound naming the path",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.File("absent.safetensors");
  auto file = SafetensorsFile::Open(path);
  REQUIRE_FALSE(file.ok());
  CHECK(file.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(file.status().message()), Catch::Contains(path));
}

TEST_CASE("Open on a directory is rejected", "[safetensors]") {
  TempDir dir;
  auto file = SafetensorsFile::Open(dir.path());
  REQUIRE_FALSE(file.ok());
  CHECK_THAT(std::string(file.status().message()),
             Catch::Contains("not a regular file"));
}

}  // namespace
}  // namespace tandem::safetensors
