#include "kernels/finite_scan.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace tandem::kernels {
namespace {

absl::Span<const uint8_t> Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4};
}

TEST_CASE("FindNonFinite finds NaN and infinities in F32 at any position",
          "[finite]") {
  std::vector<float> v(10000, 1.5f);
  v[17] = -0.0f;
  v[18] = std::numeric_limits<float>::denorm_min();
  v[19] = std::numeric_limits<float>::max();
  CHECK_FALSE(FindNonFinite(Bytes(v), FloatFormat::kF32).has_value());
  for (uint64_t at : {0u, 2047u, 2048u, 5000u, 9999u}) {
    std::vector<float> w = v;
    w[at] = std::nanf("");
    auto found = FindNonFinite(Bytes(w), FloatFormat::kF32);
    REQUIRE(found.has_value());
    CHECK(found->index == at);
    CHECK(found->nan);
    CHECK(std::string(NonFiniteName(*found)) == "NaN");
    w[at] = -std::numeric_limits<float>::infinity();
    found = FindNonFinite(Bytes(w), FloatFormat::kF32);
    REQUIRE(found.has_value());
    CHECK(found->index == at);
    CHECK_FALSE(found->nan);
    CHECK(std::string(NonFiniteName(*found)) == "-Inf");
  }
  // The first of several.
  v[9000] = std::numeric_limits<float>::infinity();
  v[3000] = std::nanf("");
  CHECK(FindNonFinite(Bytes(v), FloatFormat::kF32)->index == 3000);
}

TEST_CASE("FindNonFinite reads BF16 and F16 by their own exponent fields",
          "[finite]") {
  // 0x7C00 is +Inf in F16 but a finite BF16 (about 2.6e36).
  std::vector<uint16_t> words(3000, 0x3F80);  // 1.0 in BF16
  auto bytes = [&words]() {
    return absl::Span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(words.data()), words.size() * 2);
  };
  CHECK_FALSE(FindNonFinite(bytes(), FloatFormat::kBF16).has_value());
  CHECK_FALSE(FindNonFinite(bytes(), FloatFormat::kF16).has_value());
  words[2100] = 0x7C00;
  CHECK_FALSE(FindNonFinite(bytes(), FloatFormat::kBF16).has_value());
  REQUIRE(FindNonFinite(bytes(), FloatFormat::kF16).has_value());
  CHECK(FindNonFinite(bytes(), FloatFormat::kF16)->index == 2100);
  words[2100] = 0x3F80;
  words[7] = 0xFFC1;  // a negative NaN in BF16
  auto found = FindNonFinite(bytes(), FloatFormat::kBF16);
  REQUIRE(found.has_value());
  CHECK(found->index == 7);
  CHECK(found->nan);
}

TEST_CASE("FindNonFinite needs no alignment and ignores a partial element",
          "[finite]") {
  std::vector<uint8_t> raw(1 + 4 * 100 + 3, 0);
  const float nan = std::nanf("");
  std::memcpy(raw.data() + 1 + 4 * 42, &nan, 4);
  auto found = FindNonFinite({raw.data() + 1, raw.size() - 1},
                             FloatFormat::kF32);
  REQUIRE(found.has_value());
  CHECK(found->index == 42);
  std::memset(raw.data(), 0, raw.size());
  raw[raw.size() - 1] = 0xFF;  // the partial element's bytes
  raw[raw.size() - 2] = 0xFF;
  CHECK_FALSE(FindNonFinite({raw.data() + 1, raw.size() - 1},
                            FloatFormat::kF32)
                  .has_value());
}

}  // namespace
}  // namespace tandem::kernels
