// Each way a safetensors file can be malformed is rejected with an error
// that names the file and the offending tensor or field.

#include <catch2/catch.hpp>
#include <initializer_list>
#include <string>

#include "common/safetensors/safetensors_file.h"
#include "tests/unit/safetensors_test_util.h"

namespace tandem::safetensors {
namespace {

using testing::RawFile;
using testing::TempDir;
using testing::WriteBytes;

// Writes `bytes` as model.safetensors, opens it, and returns the error
// message after checking it is InvalidArgument and starts with the path.
std::string OpenError(const std::string& bytes) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  WriteBytes(path, bytes);
  auto file = SafetensorsFile::Open(path);
  REQUIRE_FALSE(file.ok());
  CHECK(file.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(file.status().message());
  CHECK_THAT(message, Catch::StartsWith(path + ": "));
  return message;
}

std::string HeaderError(const std::string& header, size_t data_size) {
  return OpenError(RawFile(header, data_size));
}

TEST_CASE("A file shorter than 8 bytes is rejected", "[safetensors]") {
  CHECK_THAT(OpenError(""), Catch::Contains("file is 0 bytes, shorter"));
  CHECK_THAT(OpenError("abcde"), Catch::Contains("file is 5 bytes, shorter"));
}

TEST_CASE("A header length of 0 is rejected", "[safetensors]") {
  CHECK_THAT(OpenError(RawFile("", 16)), Catch::Contains("header length is 0"));
}

TEST_CASE("A header length past the end of the file is rejected",
          "[safetensors]") {
  CHECK_THAT(OpenError(RawFile("{}", 0, /*declared_header_length=*/3)),
             Catch::Contains("header length 3 exceeds the file: only 2 bytes"));
}

TEST_CASE("A header length above 100 MiB is rejected", "[safetensors]") {
  CHECK_THAT(OpenError(RawFile("{}", 0, int64_t{100} * 1024 * 1024 + 1)),
             Catch::Contains("header length 104857601 exceeds the limit"));
  CHECK_THAT(OpenError(RawFile("{}", 0, INT64_MAX)),
             Catch::Contains("exceeds the limit"));
}

TEST_CASE("A header that is not well-formed JSON is rejected",
          "[safetensors]") {
  CHECK_THAT(HeaderError("{\"a\": ", 0),
             Catch::Contains("header is not valid JSON"));
  CHECK_THAT(HeaderError("{} trailing", 0),
             Catch::Contains("header is not valid JSON"));
  CHECK_THAT(HeaderError("{\"\xff\": 1}", 0),
             Catch::Contains("header is not valid JSON"));
  CHECK_THAT(HeaderError(std::string("{}\0\0", 4), 0),
             Catch::Contains("header is not valid JSON"));
}

TEST_CASE("A header that is not a JSON object is rejected", "[safetensors]") {
  CHECK_THAT(HeaderError("[1, 2]", 0),
             Catch::Contains("header is a JSON array, not an object"));
  CHECK_THAT(HeaderError("7", 0),
             Catch::Contains("header is a JSON number, not an object"));
}

TEST_CASE("A tensor entry that is not an object is rejected", "[safetensors]") {
  CHECK_THAT(HeaderError(R"({"w": [1]})", 0),
             Catch::Contains("tensor 'w': entry is a JSON array"));
}

TEST_CASE("A tensor entry missing dtype, shape or data_offsets is rejected",
          "[safetensors]") {
  CHECK_THAT(HeaderError(R"({"w": {"shape": [1], "data_offsets": [0, 1]}})", 1),
             Catch::Contains("tensor 'w': missing 'dtype'"));
  CHECK_THAT(
      HeaderError(R"({"w": {"dtype": "U8", "data_offsets": [0, 1]}})", 1),
      Catch::Contains("tensor 'w': missing 'shape'"));
  CHECK_THAT(HeaderError(R"({"w": {"dtype": "U8", "shape": [1]}})", 1),
             Catch::Contains("tensor 'w': missing 'data_offsets'"));
}

TEST_CASE("Tensor fields of the wrong JSON type are rejected",
          "[safetensors]") {
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 1]}})", 1),
      Catch::Contains("tensor 'w': 'dtype' is a JSON number, not a string"));
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "U8", "shape": "1", "data_offsets": [0, 1]}})", 1),
      Catch::Contains("tensor 'w': 'shape' is a JSON string, not an array"));
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "U8", "shape": [1.5], "data_offsets": [0, 1]}})",
          1),
      Catch::Contains("tensor 'w': shape[0] is a JSON number, not a "
                      "non-negative integer"));
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})",
          1),
      Catch::Contains("tensor 'w': 'data_offsets' must be an array of two "
                      "non-negative integers"));
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})",
          1),
      Catch::Contains("tensor 'w': 'data_offsets' must be an array of two"));
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": "0-1"}})", 1),
      Catch::Contains("tensor 'w': 'data_offsets' must be an array of two"));
}

TEST_CASE("data_offsets are described, not echoed, when malformed",
          "[safetensors]") {
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, -1]}})",
          1),
      Catch::Contains("got [0, -1]"));
  CHECK_THAT(
      HeaderError(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": )"
                  R"([0, 1, 2, 3, 4, 5]}})",
                  1),
      Catch::Contains("got an array of 6 elements"));
}

TEST_CASE("A header nested deeper than 64 levels is rejected",
          "[safetensors]") {
  const std::string deep =
      "{\"w\": " + std::string(100, '[') + std::string(100, ']') + "}";
  CHECK_THAT(HeaderError(deep, 0),
             Catch::Contains("header has nesting deeper than 64 levels"));
  const std::string ok_depth =
      "{\"w\": {\"dtype\": \"U8\", \"shape\": [1], "
      "\"data_offsets\": [0, 1], \"x\": " +
      std::string(60, '[') + std::string(60, ']') + "}}";
  TempDir dir;
  WriteBytes(dir.File("m.safetensors"), RawFile(ok_depth, 1));
  CHECK(SafetensorsFile::Open(dir.File("m.safetensors")).ok());
}

TEST_CASE("An unknown dtype is rejected", "[safetensors]") {
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 1]}})",
          1),
      Catch::Contains("tensor 'w': unknown dtype 'F33'"));
}

TEST_CASE("A negative dimension is rejected", "[safetensors]") {
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "U8", "shape": [2, -3], "data_offsets": [0, 0]}})",
          0),
      Catch::Contains("tensor 'w': shape[1] = -3 is a negative dimension"));
}

TEST_CASE("A dimension beyond int64 is rejected", "[safetensors]") {
  CHECK_THAT(
      HeaderError(R"({"w": {"dtype": "U8", "shape": [9223372036854775808],)"
                  R"( "data_offsets": [0, 0]}})",
                  0),
      Catch::Contains("tensor 'w': shape[0] = 9223372036854775808 does not "
                      "fit in int64"));
}

TEST_CASE("An element count overflowing 64 bits is rejected", "[safetensors]") {
  CHECK_THAT(
      HeaderError(R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296],)"
                  R"( "data_offsets": [0, 0]}})",
                  0),
      Catch::Contains("tensor 'w': dtype U8 shape [4294967296,4294967296] "
                      "element count overflows 64 bits"));
  CHECK_THAT(
      HeaderError(R"({"w": {"dtype": "F64", "shape": [4611686018427387904],)"
                  R"( "data_offsets": [0, 0]}})",
                  0),
      Catch::Contains("tensor 'w': dtype F64 shape [4611686018427387904] "
                      "byte size overflows 64 bits"));
}

TEST_CASE("data_offsets with begin after end are rejected", "[safetensors]") {
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [4, 3]}})", 4),
      Catch::Contains("tensor 'w': data_offsets [4, 3] has begin > end"));
}

TEST_CASE("data_offsets ending past the data buffer are rejected",
          "[safetensors]") {
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", 7),
      Catch::Contains("tensor 'w': data_offsets [0, 8] ends past the data "
                      "buffer of 7 bytes"));
  CHECK_THAT(
      HeaderError(R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": )"
                  R"([18446744073709551615, 18446744073709551615]}})",
                  7),
      Catch::Contains("ends past the data buffer"));
}

TEST_CASE("A byte range that does not match dtype and shape is rejected",
          "[safetensors]") {
  CHECK_THAT(HeaderError(R"({"lm_head.weight": {"dtype": "F32", "shape": )"
                         R"([5, 6], "data_offsets": [0, 100]}})",
                         100),
             Catch::Contains("model.safetensors: tensor 'lm_head.weight': "
                             "data_offsets [0, 100] but dtype F32 shape [5,6] "
                             "needs 120 bytes"));
}

TEST_CASE("Overlapping tensors are rejected", "[safetensors]") {
  CHECK_THAT(
      HeaderError(
          R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},)"
          R"( "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}})",
          12),
      Catch::Contains("tensor 'b' data_offsets [4, 12] overlaps tensor 'a' "
                      "data_offsets [0, 8]"));
  CHECK_THAT(
      HeaderError(
          R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},)"
          R"( "b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})",
          8),
      Catch::Contains("overlaps tensor 'a'"));
}

TEST_CASE("A hole in the data buffer is rejected", "[safetensors]") {
  CHECK_THAT(
      HeaderError(
          R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
          R"( "b": {"dtype": "U8", "shape": [4], "data_offsets": [6, 10]}})",
          10),
      Catch::Contains("data buffer bytes [4, 6) before tensor 'b' belong to "
                      "no tensor"));
  CHECK_THAT(
      HeaderError(
          R"({"b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})", 6),
      Catch::Contains("data buffer bytes [0, 2) before tensor 'b'"));
}

TEST_CASE("Data bytes after the last tensor are rejected", "[safetensors]") {
  CHECK_THAT(
      HeaderError(
          R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})", 9),
      Catch::Contains("data buffer bytes [4, 9) after the last tensor belong "
                      "to no tensor"));
  CHECK_THAT(HeaderError("{}", 1),
             Catch::Contains("data buffer bytes [0, 1) after the last"));
}

TEST_CASE("Duplicate tensor names are rejected", "[safetensors]") {
  CHECK_THAT(
      HeaderError(
          R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
          R"( "w": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})",
          8),
      Catch::Contains("duplicate tensor name 'w'"));
}

TEST_CASE("A key repeated inside a tensor entry is rejected", "[safetensors]") {
  CHECK_THAT(
      HeaderError(R"({"w": {"dtype": "U8", "dtype": "F32", "shape": [4],)"
                  R"( "data_offsets": [0, 4]}})",
                  4),
      Catch::Contains("tensor 'w': duplicate key 'dtype'"));
}

TEST_CASE("Malformed __metadata__ is rejected", "[safetensors]") {
  CHECK_THAT(HeaderError(R"({"__metadata__": ["pt"]})", 0),
             Catch::Contains("'__metadata__' is a JSON array, not an object"));
  CHECK_THAT(HeaderError(R"({"__metadata__": {"step": 3}})", 0),
             Catch::Contains("'__metadata__': value of 'step' is a JSON "
                             "number, not a string"));
  CHECK_THAT(HeaderError(R"({"__metadata__": {"a": "1", "a": "2"}})", 0),
             Catch::Contains("'__metadata__': duplicate key 'a'"));
}

TEST_CASE("Trailing spaces in the header and unknown entry keys are accepted",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  WriteBytes(path, RawFile(R"({"w": {"dtype": "U8", "shape": [2],)"
                           R"( "data_offsets": [0, 2], "extra": {}}}   )",
                           2));
  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  REQUIRE((*file)->Find("w") != nullptr);
  CHECK((*file)->Find("w")->nbytes == 2);
}

}  // namespace
}  // namespace tandem::safetensors
