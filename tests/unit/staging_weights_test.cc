#include "common/weights/staging_weights.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/weights/background_receiver.h"
#include "tests/support/in_process_transport.h"
#include "kernels/anchor_policy.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

FlatWeightLayout SmallLayout() {
  auto layout = FlatWeightLayout::Create(
      testing::SmallModelTensors(), {.bucket_bytes = 4096, .alignment = 64});
  REQUIRE(layout.ok());
  return *std::move(layout);
}

bool SameBytes(absl::Span<const uint8_t> a, const WeightBuffer& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

// The trainer's side of the tests: versions of a buffer, published full at
// anchors and as deltas in between.
class FakeTrainer {
 public:
  FakeTrainer(const FlatWeightLayout& layout, WeightSender* sender,
              uint64_t anchor_every)
      : layout_(layout),
        sender_(sender),
        policy_(*kernels::AnchorPolicy::Create(anchor_every)),
        current_(layout.total_bytes()),
        previous_(layout.total_bytes()) {
    testing::FillRandom(layout_, &current_, rng_);
  }

  // Publishes the current weights as version `v` (after mutating them for
  // v > 0).
  void Step(uint64_t v) {
    if (v > 0) {
      std::memcpy(previous_.data(), current_.data(), current_.size());
      testing::Perturb(layout_, &current_, rng_, 0.01);
    }
    auto manifest = layout_.BuildManifest(current_.span(), v);
    REQUIRE(manifest.ok());
    manifest->set_anchor_version(policy_.ScheduledAnchorAtOrBefore(v));
    if (policy_.IsScheduledAnchor(v)) {
      REQUIRE(
          sender_->Publish(*manifest, current_.span(), absl::InfiniteFuture())
              .ok());
      return;
    }
    auto delta = kernels::EncodeBf16Delta(kernels::AsWords(previous_.span()),
                                          kernels::AsWords(current_.span()));
    REQUIRE(delta.ok());
    manifest->set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
    manifest->set_base_version(v - 1);
    REQUIRE(sender_->Publish(*manifest, *delta, absl::InfiniteFuture()).ok());
  }

  const WeightBuffer& current() const { return current_; }

 private:
  const FlatWeightLayout& layout_;
  WeightSender* sender_;
  kernels::AnchorPolicy policy_;
  std::mt19937_64 rng_{42};
  WeightBuffer current_;
  WeightBuffer previous_;
};

TEST_CASE("Staged version becomes live only at Commit, by pointer swap",
          "[weights][staging]") {
  const FlatWeightLayout layout = SmallLayout();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  CHECK_FALSE(s.live_version().has_value());
  CHECK_FALSE(s.Commit().ok());

  std::mt19937_64 rng(1);
  WeightBuffer v1(layout.total_bytes());
  testing::FillRandom(layout, &v1, rng);
  auto m1 = layout.BuildManifest(v1.span(), 1);
  REQUIRE(m1.ok());
  REQUIRE(s.Begin(*m1).ok());
  for (const BucketRange& b : layout.buckets()) {
    CHECK_FALSE(s.ready());
    auto dst = s.MutableBucket(b.index);
    REQUIRE(dst.ok());
    std::memcpy(dst->data(), v1.data() + b.offset, b.size);
    REQUIRE(s.FinishBucket(b.index).ok());
  }
  CHECK(s.ready());
  CHECK_FALSE(s.live_version().has_value());
  auto committed = s.Commit();
  REQUIRE(committed.ok());
  CHECK(*committed == 1);
  const LiveWeights live1 = s.live();
  CHECK(live1.version == 1u);
  CHECK(SameBytes(live1.bytes, v1));

  // Receiving v2 does not touch live; Commit flips to the other buffer.
  WeightBuffer v2(layout.total_bytes());
  testing::FillRandom(layout, &v2, rng);
  auto m2 = layout.BuildManifest(v2.span(), 2);
  REQUIRE(m2.ok());
  REQUIRE(StagePayload(&s, *m2, v2.span()).ok());
  CHECK(SameBytes(s.live().bytes, v1));
  CHECK(s.live().version == 1u);
  REQUIRE(s.Commit().ok());
  const LiveWeights live2 = s.live();
  CHECK(live2.version == 2u);
  CHECK(live2.bytes.data() != live1.bytes.data());
  CHECK(SameBytes(live2.bytes, v2));
  CHECK(s.stats().commits == 2);

  // Old or equal versions are refused.
  CHECK(s.Begin(*m2).code() == absl::StatusCode::kFailedPrecondition);
  // A delta whose base is not live is refused.
  v1::WeightManifest delta = *m2;
  delta.set_policy_version(9);
  delta.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
  delta.set_base_version(8);
  CHECK(s.Begin(delta).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE(
    "A held live buffer is never written: the next versions go elsewhere",
    "[weights][staging]") {
  const FlatWeightLayout layout = SmallLayout();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  CHECK(s.live_buffer() == nullptr);  // nothing live yet
  std::mt19937_64 rng(5);
  std::vector<WeightBuffer> versions;
  for (uint64_t v = 1; v <= 4; ++v) {
    versions.emplace_back(layout.total_bytes());
    testing::FillRandom(layout, &versions.back(), rng);
  }
  auto stage = [&](uint64_t v) {
    auto m = layout.BuildManifest(versions[v - 1].span(), v);
    REQUIRE(m.ok());
    REQUIRE(StagePayload(&s, *m, versions[v - 1].span()).ok());
    REQUIRE(s.Commit().ok());
  };
  stage(1);
  std::shared_ptr<const WeightBuffer> held1 = s.live_buffer();
  REQUIRE(held1 != nullptr);
  CHECK(held1->data() == s.live().bytes.data());
  // v2 goes into the other buffer (not held); v3 would overwrite v1's,
  // which is held: it gets a new one, and v1's bytes stay.
  stage(2);
  CHECK(s.stats().staging_allocations == 0);
  std::shared_ptr<const WeightBuffer> held2 = s.live_buffer();
  stage(3);
  CHECK(s.stats().staging_allocations == 1);
  CHECK(SameBytes(held1->span(), versions[0]));
  CHECK(SameBytes(s.live().bytes, versions[2]));
  CHECK(s.live().bytes.data() != held1->data());
  // Released: v4 reuses v2's buffer (held2 dropped), no allocation.
  const uint8_t* v2_data = held2->data();
  held2.reset();
  stage(4);
  CHECK(s.stats().staging_allocations == 1);
  CHECK(s.live().bytes.data() == v2_data);
  CHECK(SameBytes(s.live().bytes, versions[3]));
  CHECK(SameBytes(held1->span(), versions[0]));

  auto inplace = StagingWeights::Create(layout, StagingMode::kInplace);
  REQUIRE(inplace.ok());
  CHECK((*inplace)->live_buffer() == nullptr);
}

TEST_CASE(
    "Pieces checksummed as they arrive seal a bucket like a whole-bucket "
    "check: a flipped byte inside a piece or after the last piece is "
    "caught, pieces out of order are refused, offset 0 starts over",
    "[weights][staging]") {
  const FlatWeightLayout layout = SmallLayout();
  REQUIRE(layout.buckets().size() >= 2);
  std::mt19937_64 rng(3);
  WeightBuffer v(layout.total_bytes());
  testing::FillRandom(layout, &v, rng);
  auto manifest = layout.BuildManifest(v.span(), 1);
  REQUIRE(manifest.ok());
  const BucketRange& b0 = layout.buckets()[0];
  REQUIRE(b0.size % 1000 != 0);  // the last piece is short

  // flip: -1 none; otherwise the bucket-0 byte flipped before checksumming.
  // covered: bytes of bucket 0 checksummed in 1000-byte pieces.
  auto stage = [&](StagingWeights& s, int64_t flip, uint64_t covered) {
    REQUIRE(s.Begin(*manifest).ok());
    for (const BucketRange& b : layout.buckets()) {
      auto dst = s.MutableBucket(b.index);
      REQUIRE(dst.ok());
      std::memcpy(dst->data(), v.data() + b.offset, b.size);
    }
    if (flip >= 0) (*s.MutableBucket(0))[flip] ^= 0x10;
    for (uint64_t off = 0; off < covered; off += 1000) {
      REQUIRE(s.ChecksumBucketPiece(0, off, std::min<uint64_t>(
                                                1000, covered - off))
                  .ok());
    }
    absl::Status st;
    for (const BucketRange& b : layout.buckets()) {
      st.Update(s.FinishBucket(b.index));
    }
    return st;
  };
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;

  SECTION("every piece clean: committed bit for bit") {
    REQUIRE(stage(s, -1, b0.size).ok());
    REQUIRE(s.Commit().ok());
    CHECK(SameBytes(s.live().bytes, v));
  }
  SECTION("clean with part of the bucket left to FinishBucket") {
    REQUIRE(stage(s, -1, 2000).ok());
    REQUIRE(s.Commit().ok());
    CHECK(SameBytes(s.live().bytes, v));
  }
  SECTION("a flipped byte inside a checksummed piece") {
    const absl::Status st = stage(s, 1500, b0.size);
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(st.message()).find("bucket 0") != std::string::npos);
    CHECK_FALSE(s.Commit().ok());
  }
  SECTION("a flipped byte after the last checksummed piece") {
    const absl::Status st = stage(s, 2500, 2000);
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK_FALSE(s.Commit().ok());
  }
  SECTION("pieces out of order or past the bucket") {
    REQUIRE(s.Begin(*manifest).ok());
    CHECK(s.ChecksumBucketPiece(0, 1000, 1000).code() ==
          absl::StatusCode::kInvalidArgument);
    REQUIRE(s.ChecksumBucketPiece(0, 0, 1000).ok());
    CHECK(s.ChecksumBucketPiece(0, 2000, 1000).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(s.ChecksumBucketPiece(0, 1000, b0.size).code() ==
          absl::StatusCode::kInvalidArgument);
  }
  SECTION("a bucket read again from offset 0 is checksummed afresh") {
    REQUIRE(s.Begin(*manifest).ok());
    for (const BucketRange& b : layout.buckets()) {
      std::memcpy(s.MutableBucket(b.index)->data(), v.data() + b.offset,
                  b.size);
    }
    // The first read of bucket 0 saw a wrong byte and broke off.
    (*s.MutableBucket(0))[10] ^= 0x01;
    REQUIRE(s.ChecksumBucketPiece(0, 0, 1000).ok());
    (*s.MutableBucket(0))[10] ^= 0x01;
    for (uint64_t off = 0; off < b0.size; off += 1000) {
      REQUIRE(s.ChecksumBucketPiece(
                   0, off, std::min<uint64_t>(1000, b0.size - off))
                  .ok());
    }
    for (const BucketRange& b : layout.buckets()) {
      REQUIRE(s.FinishBucket(b.index).ok());
    }
    REQUIRE(s.Commit().ok());
    CHECK(SameBytes(s.live().bytes, v));
  }
}

// Sets element `index` of tensor `name` (BF16 or F32) in `buf` to `bits`
// (the element's high 16 bits; the low ones, for F32, are zeroed).
void SetElement(const FlatWeightLayout& layout, WeightBuffer* buf,
                const std::string& name, uint64_t index, uint16_t bits) {
  const TensorPlacement* t = layout.Find(name);
  REQUIRE(t != nullptr);
  if (t->info.dtype == v1::DTYPE_F32) {
    const uint32_t word = uint32_t{bits} << 16;
    std::memcpy(buf->data() + t->offset + 4 * index, &word, 4);
  } else {
    std::memcpy(buf->data() + t->offset + 2 * index, &bits, 2);
  }
}

TEST_CASE("A version holding a NaN or an Inf is refused and live stays",
          "[weights][staging][finite]") {
  const FlatWeightLayout layout = SmallLayout();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  std::mt19937_64 rng(9);
  WeightBuffer good(layout.total_bytes());
  testing::FillRandom(layout, &good, rng);
  auto m0 = layout.BuildManifest(good.span(), 0);
  REQUIRE(m0.ok());
  REQUIRE(StagePayload(&s, *m0, good.span()).ok());
  REQUIRE(s.Commit().ok());
  CHECK_FALSE(s.refused_version().has_value());

  // A checksum proves the bytes are the trainer's, not that they are sane:
  // the manifest is built over the poisoned bytes, so every CRC matches.
  struct Case {
    const char* tensor;
    uint64_t index;
    uint16_t bits;
    const char* what;
  };
  const Case cases[] = {
      {"lm_head.weight", 2047, 0x7FC0, "element 2047 is NaN"},
      {"model.layers.0.input_layernorm.weight", 31, 0xFF80,
       "element 31 is -Inf"},
      // A tensor that spans buckets 1 to 3: the element lies in bucket 2,
      // whose slice of the tensor starts at element 960.
      {"model.layers.0.mlp.up_proj.weight", 1000, 0x7F80,
       "element 1000 is +Inf (bucket 2)"},
  };
  uint64_t version = 1;
  for (const Case& c : cases) {
    INFO(c.tensor);
    WeightBuffer bad(layout.total_bytes());
    std::memcpy(bad.data(), good.data(), good.size());
    SetElement(layout, &bad, c.tensor, c.index, c.bits);
    auto m = layout.BuildManifest(bad.span(), version);
    REQUIRE(m.ok());
    const absl::Status st = StagePayload(&s, *m, bad.span());
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    const std::string message(st.message());
    CHECK_THAT(message, Catch::Contains(absl::StrCat("weights v", version)));
    CHECK_THAT(message, Catch::Contains(absl::StrCat("'", c.tensor, "'")));
    CHECK_THAT(message, Catch::Contains(c.what));
    CHECK_FALSE(s.ready());
    CHECK_FALSE(s.Commit().ok());
    CHECK(s.live().version == 0u);
    CHECK(SameBytes(s.live().bytes, good));
    CHECK(s.refused_version() == version);
    ++version;
  }
  CHECK(s.stats().nonfinite_versions == 3);
  CHECK(s.stats().rejected_versions == 3);

  // A delta whose result holds a NaN is refused too (the delta itself is
  // well formed and every bucket CRC matches the poisoned result).
  WeightBuffer next(layout.total_bytes());
  std::memcpy(next.data(), good.data(), good.size());
  SetElement(layout, &next, "model.norm.weight", 1, 0x7FC1);
  auto delta = kernels::EncodeBf16Delta(kernels::AsWords(good.span()),
                                        kernels::AsWords(next.span()));
  REQUIRE(delta.ok());
  auto md = layout.BuildManifest(next.span(), version);
  REQUIRE(md.ok());
  md->set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
  md->set_base_version(0);
  const absl::Status st = StagePayload(&s, *md, *delta);
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(st.message()),
             Catch::Contains("'model.norm.weight' (BF16) holds a non-finite "
                             "value: element 1 is NaN"));
  CHECK(s.live().version == 0u);
  CHECK(SameBytes(s.live().bytes, good));
  CHECK(s.refused_version() == version);

  // A finite version after them goes through.
  WeightBuffer fine(layout.total_bytes());
  testing::FillRandom(layout, &fine, rng);
  auto mf = layout.BuildManifest(fine.span(), version + 1);
  REQUIRE(mf.ok());
  REQUIRE(StagePayload(&s, *mf, fine.span()).ok());
  REQUIRE(s.Commit().ok());
  CHECK(SameBytes(s.live().bytes, fine));
}

TEST_CASE("A corrupted bucket is detected and the version is not committed",
          "[weights][staging]") {
  const FlatWeightLayout layout = SmallLayout();
  InProcessWeightBus bus;
  auto sender = bus.NewSender();
  auto receiver = bus.NewReceiver();
  FakeTrainer trainer(layout, sender.get(), /*anchor_every=*/100);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;

  trainer.Step(0);
  REQUIRE(receiver->ReceiveNext(&s, absl::InfiniteFuture()).ok());
  REQUIRE(s.Commit().ok());

  // Full payload with a flipped byte in bucket 2.
  WeightBuffer good(layout.total_bytes());
  std::memcpy(good.data(), trainer.current().data(), good.size());
  WeightBuffer bad(layout.total_bytes());
  std::mt19937_64 rng(5);
  testing::FillRandom(layout, &bad, rng);
  auto manifest = layout.BuildManifest(bad.span(), 1);
  REQUIRE(manifest.ok());
  bad.data()[2 * 4096 + 5] ^= 1;
  absl::Status st = StagePayload(&s, *manifest, bad.span());
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(st.message()).find("bucket 2") != std::string::npos);
  CHECK_FALSE(s.ready());
  CHECK_FALSE(s.Commit().ok());
  CHECK(s.live().version == 0u);
  CHECK(SameBytes(s.live().bytes, good));

  // A corrupted delta (flipped byte in transit) is rejected the same way.
  trainer.Step(1);
  bus.CorruptNextDeliveryForTest(40);
  auto received = receiver->ReceiveNext(&s, absl::InfiniteFuture());
  CHECK_FALSE(received.ok());
  CHECK_FALSE(s.ready());
  CHECK(s.live().version == 0u);
  CHECK(SameBytes(s.live().bytes, good));
  CHECK(s.stats().rejected_versions == 2);
  // The clean copy then goes through.
  received = receiver->ReceiveNext(&s, absl::InfiniteFuture());
  REQUIRE(received.ok());
  REQUIRE(s.Commit().ok());
  CHECK(SameBytes(s.live().bytes, trainer.current()));
}

TEST_CASE(
    "Versions through the in-process transport match the trainer bit "
    "for bit, across anchors, for live and late receivers",
    "[weights][transport]") {
  const FlatWeightLayout layout = SmallLayout();
  InProcessWeightBus bus(/*retain=*/16);
  auto sender = bus.NewSender();
  FakeTrainer trainer(layout, sender.get(), /*anchor_every=*/4);
  auto receiver = bus.NewReceiver();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  for (uint64_t v = 0; v <= 10; ++v) {
    trainer.Step(v);
    auto got = receiver->ReceiveNext(staging->get(), absl::InfiniteFuture());
    REQUIRE(got.ok());
    CHECK(*got == v);
    REQUIRE((*staging)->Commit().ok());
    REQUIRE(SameBytes((*staging)->live().bytes, trainer.current()));
  }
  CHECK((*staging)->stats().delta_versions == 8);
  CHECK((*staging)->stats().full_versions == 3);

  // A late joiner starts from the newest retained anchor (8), then deltas.
  auto late = bus.NewReceiver();
  auto late_staging = StagingWeights::Create(layout, StagingMode::kInplace);
  REQUIRE(late_staging.ok());
  std::vector<uint64_t> seen;
  while (!(*late_staging)->live_version().has_value() ||
         *(*late_staging)->live_version() < 10) {
    auto got = late->ReceiveNext(late_staging->get(), absl::InfiniteFuture());
    REQUIRE(got.ok());
    seen.push_back(*got);
    REQUIRE((*late_staging)->Commit().ok());
  }
  CHECK(seen == std::vector<uint64_t>{8, 9, 10});
  CHECK(SameBytes((*late_staging)->live().bytes, trainer.current()));
}

TEST_CASE(
    "Inplace mode invalidates live while receiving and after a "
    "rejected version",
    "[weights][staging]") {
  const FlatWeightLayout layout = SmallLayout();
  auto staging = StagingWeights::Create(layout, StagingMode::kInplace);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  std::mt19937_64 rng(3);
  WeightBuffer v1(layout.total_bytes());
  testing::FillRandom(layout, &v1, rng);
  auto m1 = layout.BuildManifest(v1.span(), 1);
  REQUIRE(m1.ok());
  REQUIRE(StagePayload(&s, *m1, v1.span()).ok());
  CHECK_FALSE(s.live_version().has_value());
  const uint8_t* before = s.live().bytes.data();
  REQUIRE(s.Commit().ok());
  CHECK(s.live().bytes.data() == before);  // one buffer
  CHECK(s.live_version() == 1u);

  WeightBuffer v2(layout.total_bytes());
  testing::FillRandom(layout, &v2, rng);
  auto m2 = layout.BuildManifest(v2.span(), 2);
  REQUIRE(m2.ok());
  v2.data()[100] ^= 1;
  CHECK(StagePayload(&s, *m2, v2.span()).code() == absl::StatusCode::kDataLoss);
  CHECK_FALSE(s.live_version().has_value());
  CHECK_FALSE(s.Commit().ok());
  v2.data()[100] ^= 1;
  REQUIRE(StagePayload(&s, *m2, v2.span()).ok());
  REQUIRE(s.Commit().ok());
  CHECK(SameBytes(s.live().bytes, v2));
}

TEST_CASE(
    "Engine reads of live never see a torn version while a receiver "
    "stages the next ones",
    "[weights][staging][threads]") {
  const FlatWeightLayout layout = SmallLayout();
  InProcessWeightBus bus(/*retain=*/64);
  auto sender = bus.NewSender();
  FakeTrainer trainer(layout, sender.get(), /*anchor_every=*/5);
  for (uint64_t v = 0; v <= 40; ++v) trainer.Step(v);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  auto receiver = bus.NewReceiver();

  BackgroundReceiver background(receiver.get(), &s,
                                {.receive_slice = absl::Milliseconds(50)});
  background.Start();
  // Engine: verify live against its manifest between commits.
  int verified = 0;
  while (!s.live_version().has_value() || *s.live_version() < 40) {
    if (s.ready()) REQUIRE(s.Commit().ok());
    const LiveWeights live = s.live();
    if (live.version.has_value()) {
      auto manifest = s.live_manifest();
      REQUIRE(manifest.has_value());
      REQUIRE(VerifyWeights(*manifest, live.bytes).ok());
      ++verified;
    }
  }
  background.Stop();
  INFO(background.stats().last_error);
  CHECK(background.stats().errors == 0);
  CHECK(background.stats().staged >= 1);
  CHECK(verified > 0);
  CHECK(SameBytes(s.live().bytes, trainer.current()));
}

TEST_CASE(
    "FinishBucket on several threads verifies a large bucket and still "
    "rejects a flipped byte in any part",
    "[weights][staging]") {
  // One 13 MiB bucket: FinishBucket(bucket, 3) checksums it in three parts
  // of over 4 MiB, on three threads.
  constexpr uint64_t kBytes = (uint64_t{13} << 20) + 128;
  auto layout = FlatWeightLayout::Create(
      {{"w", v1::DTYPE_BF16, {static_cast<int64_t>(kBytes / 2)}, kBytes}},
      {.bucket_bytes = kBytes, .alignment = 64});
  REQUIRE(layout.ok());
  REQUIRE(layout->num_buckets() == 1);
  WeightBuffer payload(layout->total_bytes());
  std::mt19937_64 rng(23);
  testing::FillRandom(*layout, &payload, rng);
  auto staging = StagingWeights::Create(*layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  uint64_t version = 0;
  // The clean bucket, then a flipped byte in the first, middle and last
  // part; with 1 MiB checksummed as a piece first or not.
  for (uint64_t flip : {uint64_t{0}, uint64_t{100}, kBytes / 2, kBytes - 1}) {
    for (bool piece : {false, true}) {
      INFO("flipped byte " << flip << " piece " << piece);
      auto manifest = layout->BuildManifest(payload.span(), ++version);
      REQUIRE(manifest.ok());
      REQUIRE(s.Begin(*manifest).ok());
      REQUIRE(s.WriteBucketChunk(0, 0, payload.span()).ok());
      if (flip != 0) {
        absl::Span<uint8_t> staged = *s.MutableBucket(0);
        staged[flip] ^= 0x04;
      }
      if (piece) REQUIRE(s.ChecksumBucketPiece(0, 0, 1 << 20).ok());
      const absl::Status finished = s.FinishBucket(0, /*checksum_threads=*/3);
      if (flip == 0) {
        CHECK(finished.ok());
        REQUIRE(s.Commit().ok());
      } else {
        CHECK(finished.code() == absl::StatusCode::kDataLoss);
        CHECK_FALSE(s.ready());
      }
    }
  }
}

TEST_CASE("Cancel unblocks a waiting receiver", "[weights][transport]") {
  const FlatWeightLayout layout = SmallLayout();
  InProcessWeightBus bus;
  auto receiver = bus.NewReceiver();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  CHECK(absl::IsDeadlineExceeded(
      receiver
          ->ReceiveNext(staging->get(), absl::Now() + absl::Milliseconds(10))
          .status()));
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    receiver->Cancel();
  });
  CHECK(absl::IsCancelled(
      receiver->ReceiveNext(staging->get(), absl::InfiniteFuture()).status()));
  canceller.join();
}

}  // namespace
}  // namespace tandem::weights
