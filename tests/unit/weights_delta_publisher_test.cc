// The publisher's decision between a sparse delta and a full anchor
// (common/weights/delta_publisher.h), as the trainer daemon makes it for
// every version: deltas between scheduled anchors (which carry a delta as
// well), a full version when the change is too dense, when the delta would
// not be smaller, when the base is missing, and always when deltas are off
// (float32); replaying published anchors + deltas reproduces every version
// bit for bit, for a receiver following along and for a late joiner.

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/weights/delta_publisher.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using Bytes = std::vector<uint8_t>;

// A trainer's successive versions of one flat buffer.
class Versions {
 public:
  explicit Versions(const FlatWeightLayout& layout)
      : layout_(layout), current_(layout.total_bytes()) {
    testing::FillRandom(layout_, &current_, rng_);
  }

  // Moves ~`density` of the words by one ULP (1.0: every tensor byte new).
  void Step(double density) {
    if (density >= 1.0) {
      testing::FillRandom(layout_, &current_, rng_);
    } else {
      testing::Perturb(layout_, &current_, rng_, density);
    }
  }

  // The current bytes as version `v`: manifest and an immutable copy.
  std::pair<v1::WeightManifest, std::shared_ptr<const Bytes>> Snapshot(
      uint64_t v) const {
    auto manifest = layout_.BuildManifest(current_.span(), v);
    REQUIRE(manifest.ok());
    return {*manifest, std::make_shared<const Bytes>(
                           current_.data(), current_.data() + current_.size())};
  }

 private:
  const FlatWeightLayout& layout_;
  std::mt19937_64 rng_{11};
  WeightBuffer current_;
};

PublishedVersion Publish(DeltaPublisher& publisher, const Versions& versions,
                         uint64_t v) {
  auto [manifest, bytes] = versions.Snapshot(v);
  absl::StatusOr<PublishedVersion> published =
      publisher.Publish(manifest, bytes);
  REQUIRE(published.ok());
  // The full payload is always there, as a FULL manifest of v.
  CHECK(published->full.manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL);
  CHECK(published->full.manifest.policy_version() == v);
  CHECK(*published->full.bytes == *bytes);
  return *std::move(published);
}

TEST_CASE(
    "bf16 versions are deltas between scheduled anchors, full when the "
    "change is dense, the delta large or the base missing",
    "[weights][delta]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Versions versions(layout);
  DeltaPublishOptions options;
  options.anchor_every = 4;
  options.max_density = 0.25;
  auto publisher = DeltaPublisher::Create(options);
  REQUIRE(publisher.ok());

  struct Expect {
    uint64_t version;
    double step_density;  // change made before publishing
    PublishReason reason;
    uint64_t anchor;
  };
  const std::vector<Expect> plan = {
      {1, 0.0, PublishReason::kNoBase, 1},  // the first version
      {2, 0.02, PublishReason::kDelta, 1},
      {3, 0.01, PublishReason::kDelta, 1},
      {4, 0.02, PublishReason::kScheduledAnchor, 4},
      {5, 0.02, PublishReason::kDelta, 4},
      {6, 0.5, PublishReason::kDense, 6},   // 50% of words > 25%
      {7, 0.02, PublishReason::kDelta, 6},  // chains from the new anchor
  };
  for (const Expect& e : plan) {
    if (e.step_density > 0) versions.Step(e.step_density);
    const PublishedVersion p = Publish(*publisher, versions, e.version);
    INFO("v" << e.version << ": " << PublishReasonName(p.reason));
    CHECK(p.reason == e.reason);
    CHECK(p.full.manifest.anchor_version() == e.anchor);
    // A scheduled anchor with a sparse change has a delta as well, for
    // receivers that hold v-1.
    CHECK(p.delta.has_value() == (e.reason == PublishReason::kDelta ||
                                  e.reason == PublishReason::kScheduledAnchor));
    if (e.version == 1) {
      CHECK_FALSE(p.density.has_value());  // nothing to compare with
    } else {
      REQUIRE(p.density.has_value());
      CHECK(*p.density == Approx(e.step_density).margin(0.02));
      CHECK(p.changed_words > 0);
    }
    if (p.delta) {
      const v1::WeightManifest& m = p.delta->manifest;
      CHECK(m.kind() == v1::WEIGHT_PAYLOAD_KIND_DELTA);
      CHECK(m.base_version() == e.version - 1);
      CHECK(m.anchor_version() == e.anchor);
      // Same version, same buckets: the receiver verifies the result
      // against them.
      CHECK(m.buckets_size() == p.full.manifest.buckets_size());
      CHECK(m.buckets(0).crc32c() == p.full.manifest.buckets(0).crc32c());
      // ~2% of the words at a few bits each: far below the full copy.
      CHECK(p.delta->bytes->size() * 10 < p.full.bytes->size());
    }
  }

  // A version whose every byte is new: the delta would not be smaller.
  auto large = DeltaPublisher::Create({true, 100, 1.0});
  REQUIRE(large.ok());
  Publish(*large, versions, 1);
  versions.Step(1.0);
  CHECK(Publish(*large, versions, 2).reason == PublishReason::kLarge);
  // A gap in the numbering (a renumbered or resumed trainer) has no base.
  versions.Step(0.01);
  const PublishedVersion gap = Publish(*large, versions, 9);
  CHECK(gap.reason == PublishReason::kNoBase);
  CHECK(gap.full.manifest.anchor_version() == 9);
}

TEST_CASE("deltas off (float32 publishing, anchor_every 1): every version full",
          "[weights][delta]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Versions versions(layout);
  auto off = DeltaPublisher::Create({false, 16, 0.25});
  auto every = DeltaPublisher::Create({true, 1, 0.25});
  REQUIRE(off.ok());
  REQUIRE(every.ok());
  for (uint64_t v = 1; v <= 3; ++v) {
    versions.Step(0.01);
    for (DeltaPublisher* p : {&*off, &*every}) {
      const PublishedVersion published = Publish(*p, versions, v);
      CHECK(published.reason == PublishReason::kDisabled);
      CHECK_FALSE(published.delta.has_value());
      CHECK(published.full.manifest.anchor_version() == v);
    }
  }
}

TEST_CASE("replaying a published anchor and its deltas is bit-exact",
          "[weights][delta]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Versions versions(layout);
  auto publisher = DeltaPublisher::Create({true, 5, 0.25});
  REQUIRE(publisher.ok());
  // A receiver that follows every version (deltas whenever there is one)
  // and a late joiner that starts from the newest anchor and replays the
  // deltas after it.
  Bytes follower;
  std::vector<PublishedVersion> published;
  uint64_t deltas = 0;
  for (uint64_t v = 1; v <= 12; ++v) {
    versions.Step(v == 7 ? 0.6 : 0.03);
    published.push_back(Publish(*publisher, versions, v));
    const PublishedVersion& p = published.back();
    if (p.delta) {
      REQUIRE(kernels::ApplyBf16Delta(
                  *p.delta->bytes,
                  kernels::AsMutableWords(absl::MakeSpan(follower)))
                  .ok());
      ++deltas;
    } else {
      follower = *p.full.bytes;
    }
    REQUIRE(follower == *p.full.bytes);
    CHECK(layout.BucketCrcs(follower) == layout.BucketCrcs(*p.full.bytes));
  }
  // 1 (first) and 7 (dense) are full only; 5 and 10 (scheduled anchors)
  // have both; the rest are deltas.
  CHECK(deltas == 10);
  const uint64_t anchor = published.back().full.manifest.anchor_version();
  CHECK(anchor == 10);
  Bytes joiner = *published[anchor - 1].full.bytes;
  for (uint64_t v = anchor + 1; v <= 12; ++v) {
    const PublishedVersion& p = published[v - 1];
    REQUIRE(p.delta.has_value());
    CHECK(p.full.manifest.anchor_version() == anchor);
    REQUIRE(
        kernels::ApplyBf16Delta(*p.delta->bytes,
                                kernels::AsMutableWords(absl::MakeSpan(joiner)))
            .ok());
  }
  CHECK(joiner == *published.back().full.bytes);
}

TEST_CASE("out-of-range delta options are refused, naming the option",
          "[weights][delta]") {
  auto zero_density = DeltaPublisher::Create({true, 16, 0.0});
  REQUIRE_FALSE(zero_density.ok());
  CHECK(zero_density.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(zero_density.status().message()).find("max_density") !=
        std::string::npos);
  CHECK_FALSE(DeltaPublisher::Create({true, 16, 1.5}).ok());
  auto zero_anchor = DeltaPublisher::Create({true, 0, 0.25});
  REQUIRE_FALSE(zero_anchor.ok());
  CHECK(std::string(zero_anchor.status().message()).find("anchor_every") !=
        std::string::npos);
  // A payload that is not the manifest's size.
  auto publisher = DeltaPublisher::Create({});
  REQUIRE(publisher.ok());
  v1::WeightManifest manifest;
  manifest.set_policy_version(1);
  manifest.set_total_bytes(8);
  CHECK(publisher->Publish(manifest, std::make_shared<const Bytes>(6))
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::weights
