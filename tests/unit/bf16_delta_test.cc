#include "kernels/bf16_delta.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/anchor_policy.h"
#include "kernels/bf16_change.h"

namespace tandem::kernels {
namespace {

using Words = std::vector<uint16_t>;

// bf16 words of plausible weights: |w| in ~[1e-3, 1e-1], random sign.
Words RandomWeights(std::mt19937_64& rng, size_t n) {
  Words w(n);
  std::uniform_real_distribution<float> mag(1e-3f, 1e-1f);
  for (auto& x : w) {
    float f = mag(rng) * ((rng() & 1) ? 1.0f : -1.0f);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  return w;
}

// Next version: each word changes with probability `density`, mostly by one
// or two ULPs, sometimes to special values (NaN payloads, -0.0, +0.0, inf)
// or to an unrelated word, so every value coding path is exercised.
Words Mutate(std::mt19937_64& rng, const Words& prev, double density) {
  Words next = prev;
  std::bernoulli_distribution changed(density);
  for (size_t i = 0; i < next.size(); ++i) {
    if (!changed(rng)) continue;
    const uint16_t old = next[i];
    uint16_t v = old;
    switch (rng() % 10) {
      case 0:
        v = static_cast<uint16_t>(0x7F80 | 1 | (rng() & 0x7F));
        break;  // NaN
      case 1:
        v = 0x8000;
        break;  // -0.0
      case 2:
        v = 0x0000;
        break;  // +0.0
      case 3:
        v = static_cast<uint16_t>(rng());
        break;
      case 4:
        v = static_cast<uint16_t>(old + 2);
        break;
      default:
        v = static_cast<uint16_t>(old + ((rng() & 1) ? 1 : -1));
        break;
    }
    if (v == old) v = static_cast<uint16_t>(old ^ 1);
    next[i] = v;
  }
  return next;
}

void RequireRoundTrip(const Words& prev, const Words& next,
                      const DeltaEncodeOptions& options = {}) {
  absl::StatusOr<std::vector<uint8_t>> delta =
      EncodeBf16Delta(prev, next, options);
  REQUIRE(delta.ok());
  absl::StatusOr<DeltaInfo> info = InspectDelta(*delta);
  REQUIRE(info.ok());
  CHECK(info->num_words == next.size());
  CHECK(info->num_changed == CountChangedWords(prev, next));
  Words patched = prev;
  REQUIRE(ApplyBf16Delta(*delta, absl::MakeSpan(patched)).ok());
  REQUIRE(patched == next);
  Words unchecked = prev;
  REQUIRE(ApplyBf16Delta(*delta, absl::MakeSpan(unchecked), false).ok());
  REQUIRE(unchecked == next);
  std::vector<uint64_t> indices;
  std::vector<uint16_t> values;
  REQUIRE(DecodeBf16Delta(*delta, prev, &indices, &values).ok());
  std::vector<uint64_t> expected;
  FindChangedWords(prev, next, &expected);
  REQUIRE(indices == expected);
  for (size_t i = 0; i < indices.size(); ++i) {
    REQUIRE(values[i] == next[indices[i]]);
  }
}

TEST_CASE("Delta round trip is bit exact at every density", "[delta]") {
  std::mt19937_64 rng(1);
  const Words base = RandomWeights(rng, 100003);
  for (double density : {0.0, 0.0001, 0.001, 0.01, 0.1, 0.5, 1.0}) {
    INFO("density " << density);
    const Words next = Mutate(rng, base, density);
    RequireRoundTrip(base, next);
    RequireRoundTrip(base, next, {DeltaValueCoding::kRaw, 16384});
    RequireRoundTrip(base, next, {DeltaValueCoding::kAuto, 7});
  }
}

TEST_CASE("Delta handles changes at index 0 and at the last index", "[delta]") {
  std::mt19937_64 rng(2);
  Words prev = RandomWeights(rng, 1000);
  Words next = prev;
  next[0] ^= 0x8000;   // sign flip: +x -> -x
  next[999] = 0x7FC1;  // NaN with a payload
  RequireRoundTrip(prev, next);
  // A single word buffer, and a change only at the end of a long buffer.
  RequireRoundTrip(Words{0x3F80}, Words{0xBF80});
  Words tail_prev(1 << 20, 0x3C00);
  Words tail_next = tail_prev;
  tail_next.back() = 0x8000;
  RequireRoundTrip(tail_prev, tail_next);
}

TEST_CASE("Delta distinguishes -0.0 from +0.0 and NaN payloads", "[delta]") {
  const Words prev = {0x0000, 0x8000, 0x7FC0, 0x7FC1, 0xFFC0, 0x7F80};
  const Words next = {0x8000, 0x0000, 0x7FC1, 0x7FC0, 0x7FC0, 0x7F80};
  CHECK(CountChangedWords(prev, next) == 5);
  RequireRoundTrip(prev, next);
}

TEST_CASE("Empty delta is valid and changes nothing", "[delta]") {
  const Words same(257, 0x1234);
  absl::StatusOr<std::vector<uint8_t>> delta = EncodeBf16Delta(same, same);
  REQUIRE(delta.ok());
  CHECK(delta->size() == 32);
  Words copy = same;
  REQUIRE(ApplyBf16Delta(*delta, absl::MakeSpan(copy)).ok());
  CHECK(copy == same);
  REQUIRE(EncodeBf16Delta(Words{}, Words{}).ok());
}

TEST_CASE("Delta replay across anchors reproduces every version bit for bit",
          "[delta][anchor]") {
  std::mt19937_64 rng(3);
  absl::StatusOr<AnchorPolicy> policy = AnchorPolicy::Create(4);
  REQUIRE(policy.ok());
  std::vector<Words> versions = {RandomWeights(rng, 50000)};
  for (int v = 1; v <= 13; ++v) {
    versions.push_back(Mutate(rng, versions.back(), v % 3 == 0 ? 0.2 : 0.01));
  }
  // Publisher: full at scheduled anchors, deltas between.
  std::vector<std::vector<uint8_t>> deltas(versions.size());
  for (size_t v = 1; v < versions.size(); ++v) {
    if (policy->IsScheduledAnchor(v)) continue;
    auto d = EncodeBf16Delta(versions[v - 1], versions[v]);
    REQUIRE(d.ok());
    deltas[v] = *std::move(d);
  }
  // A receiver joining at each version replays the latest anchor plus the
  // deltas after it.
  for (uint64_t target = 0; target < versions.size(); ++target) {
    const uint64_t anchor = policy->ScheduledAnchorAtOrBefore(target);
    const CatchUpPlan plan =
        AnchorPolicy::PlanCatchUp(std::nullopt, target, anchor);
    REQUIRE(plan.fetch_full);
    Words receiver = versions[plan.full_version];
    for (uint64_t v = plan.first_delta; v <= target; ++v) {
      REQUIRE(ApplyBf16Delta(deltas[v], absl::MakeSpan(receiver)).ok());
    }
    INFO("target " << target);
    REQUIRE(receiver == versions[target]);
  }
  // A receiver that already holds version 5 needs only 6 and 7.
  const CatchUpPlan plan = AnchorPolicy::PlanCatchUp(5, 7, 4);
  CHECK_FALSE(plan.fetch_full);
  CHECK(plan.first_delta == 6);
  CHECK(plan.num_deltas() == 2);
  CHECK(AnchorPolicy::PlanCatchUp(3, 9, 8).fetch_full);
}

TEST_CASE("AnchorPolicy publishes full when a delta is not worth it",
          "[anchor]") {
  CHECK_FALSE(AnchorPolicy::Create(0).ok());
  CHECK_FALSE(AnchorPolicy::Create(4, 0.0).ok());
  auto policy = AnchorPolicy::Create(10, 0.5);
  REQUIRE(policy.ok());
  CHECK(policy->ShouldPublishFull(0, 1, 100));
  CHECK(policy->ShouldPublishFull(20, 1, 100));
  CHECK_FALSE(policy->ShouldPublishFull(21, 50, 100));
  CHECK(policy->ShouldPublishFull(21, 51, 100));
}

TEST_CASE("EncodeSparseDelta matches EncodeBf16Delta", "[delta]") {
  std::mt19937_64 rng(4);
  const Words prev = RandomWeights(rng, 30000);
  const Words next = Mutate(rng, prev, 0.03);
  std::vector<uint64_t> indices;
  FindChangedWords(prev, next, &indices);
  Words new_values, old_values;
  for (uint64_t i : indices) {
    new_values.push_back(next[i]);
    old_values.push_back(prev[i]);
  }
  auto dense = EncodeBf16Delta(prev, next);
  auto sparse = EncodeSparseDelta(next.size(), indices, new_values, old_values);
  REQUIRE(dense.ok());
  REQUIRE(sparse.ok());
  CHECK(*dense == *sparse);
  auto raw_only = EncodeSparseDelta(next.size(), indices, new_values, {});
  REQUIRE(raw_only.ok());
  Words patched = prev;
  REQUIRE(ApplyBf16Delta(*raw_only, absl::MakeSpan(patched)).ok());
  CHECK(patched == next);
  std::vector<uint64_t> bad = {5, 5};
  CHECK_FALSE(EncodeSparseDelta(10, bad, Words{1, 2}, {}).ok());
  CHECK_FALSE(
      EncodeSparseDelta(10, std::vector<uint64_t>{10}, Words{1}, {}).ok());
}

TEST_CASE(
    "Delta of ULP-sized changes costs at most 3 bytes per element at "
    "1% density",
    "[delta]") {
  std::mt19937_64 rng(5);
  const Words prev = RandomWeights(rng, 1 << 20);
  Words next = prev;
  std::bernoulli_distribution changed(0.01);
  uint64_t n = 0;
  for (auto& w : next) {
    if (changed(rng)) {
      w = static_cast<uint16_t>(w + ((rng() & 1) ? 1 : -1));
      ++n;
    }
  }
  auto delta = EncodeBf16Delta(prev, next);
  REQUIRE(delta.ok());
  const double per_element = static_cast<double>(delta->size()) / n;
  INFO("bytes per changed element: " << per_element);
  CHECK(per_element <= 3.0);
  auto raw = EncodeBf16Delta(prev, next, {DeltaValueCoding::kRaw, 16384});
  REQUIRE(raw.ok());
  INFO("raw-value bytes per element: " << static_cast<double>(raw->size()) / n);
  CHECK(static_cast<double>(raw->size()) / n < 3.2);
}

TEST_CASE("Malformed deltas are rejected without touching the buffer",
          "[delta]") {
  std::mt19937_64 rng(6);
  const Words prev = RandomWeights(rng, 20000);
  const Words next = Mutate(rng, prev, 0.05);
  auto delta = EncodeBf16Delta(prev, next, {DeltaValueCoding::kAuto, 100});
  REQUIRE(delta.ok());
  // Every truncation fails.
  for (size_t len = 0; len < delta->size(); len += 1 + len / 7) {
    std::vector<uint8_t> cut(delta->begin(), delta->begin() + len);
    Words buf = prev;
    REQUIRE_FALSE(ApplyBf16Delta(cut, absl::MakeSpan(buf)).ok());
    REQUIRE(buf == prev);
  }
  // Wrong buffer size.
  Words shorter(prev.begin(), prev.end() - 1);
  CHECK_FALSE(ApplyBf16Delta(*delta, absl::MakeSpan(shorter)).ok());
  // Random corruption never writes out of bounds; a failed apply leaves the
  // buffer as it was.
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<uint8_t> bad = *delta;
    const size_t at = rng() % bad.size();
    bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    Words buf = prev;
    if (!ApplyBf16Delta(bad, absl::MakeSpan(buf)).ok()) REQUIRE(buf == prev);
  }
}

}  // namespace
}  // namespace tandem::kernels
