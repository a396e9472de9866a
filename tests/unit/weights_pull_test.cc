// Loopback tests of the catch-up (pull) path: WeightServerService over a
// WeightStore, GrpcPullReceiver into StagingWeights, on a port-0 server.
// The transfer tests run twice: over the raw data path (the default) and
// over the FetchWeights gRPC stream.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>

#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/pull/manifest_digest_source.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/tree_digest.h"
#include "common/weights/weight_digest.h"
#include "common/weights/weight_store.h"
#include "kernels/anchor_policy.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "tests/support/fake_clock.h"
#include "tests/support/wait_for.h"
#include "weight_server_test_util.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using Bytes = std::vector<uint8_t>;
using ::tandem::testing::AdvanceWhileWaiting;
using ::tandem::testing::FakeClock;

// Publishes like the trainer: a FULL copy of anchors and of the latest
// version, a DELTA for every other version.
class Publisher {
 public:
  Publisher(const FlatWeightLayout& layout, WeightStore* store)
      : layout_(layout), store_(store), current_(layout.total_bytes()) {
    testing::FillRandom(layout_, &current_, rng_);
  }

  void Step(uint64_t v) {
    const Bytes previous(current_.data(), current_.data() + current_.size());
    if (v > 0) testing::Perturb(layout_, &current_, rng_, 0.02);
    auto manifest = layout_.BuildManifest(current_.span(), v);
    REQUIRE(manifest.ok());
    manifest->set_anchor_version(policy_.ScheduledAnchorAtOrBefore(v));
    if (!policy_.IsScheduledAnchor(v)) {
      auto delta = kernels::EncodeBf16Delta(kernels::AsWords(previous),
                                            kernels::AsWords(current_.span()));
      REQUIRE(delta.ok());
      v1::WeightManifest dm = *manifest;
      dm.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
      dm.set_base_version(v - 1);
      REQUIRE(store_->Put(dm, std::make_shared<const Bytes>(*std::move(delta)))
                  .ok());
    }
    REQUIRE(store_
                ->Put(*manifest,
                      std::make_shared<const Bytes>(
                          current_.data(), current_.data() + current_.size()))
                .ok());
  }

  const WeightBuffer& current() const { return current_; }

 private:
  const FlatWeightLayout& layout_;
  WeightStore* store_;
  kernels::AnchorPolicy policy_ = *kernels::AnchorPolicy::Create(4);
  std::mt19937_64 rng_{7};
  WeightBuffer current_;
};

class Loopback {
 public:
  explicit Loopback(WeightServerOptions options = {})
      : server_(&store_, options) {}

  WeightStore& store() { return store_; }
  WeightServerService& service() { return server_.service(); }
  std::shared_ptr<grpc::Channel> channel() { return server_.channel(); }

 private:
  WeightStore store_{16};
  testing::WeightServerLoopback server_;
};

bool SameBytes(absl::Span<const uint8_t> a, const WeightBuffer& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

// Waits (real time, at most 10 s) until `ready()`: for a request to reach
// the server, which is real I/O.
template <typename Predicate>
bool WaitUntil(Predicate ready) {
  return ::tandem::testing::WaitFor(ready, absl::Seconds(10));
}

// ReceiveNext(deadline on `clock`) on another thread while the test
// advances `clock` in 10 ms steps whenever something waits on it.
absl::StatusOr<uint64_t> ReceiveAdvancing(GrpcPullReceiver& receiver,
                                          StagingWeights* staging,
                                          FakeClock& clock,
                                          absl::Duration wait) {
  std::atomic<bool> done{false};
  absl::StatusOr<uint64_t> got = absl::UnknownError("not returned");
  std::thread receiving([&] {
    got = receiver.ReceiveNext(staging, clock.Now() + wait);
    done.store(true);
  });
  const bool returned = AdvanceWhileWaiting(clock, absl::Milliseconds(10),
                                            [&] { return done.load(); });
  receiving.join();
  REQUIRE(returned);
  return got;
}

// One bf16 tensor of rows x cols in `bucket_bytes` buckets, filled from
// `seed` and stored in `store` as FULL version 1.
struct StoredVersion {
  FlatWeightLayout layout;
  WeightBuffer weights;
};
StoredVersion StoreOneTensorVersion(WeightStore& store, int64_t rows,
                                    int64_t cols, uint64_t bucket_bytes,
                                    uint64_t seed) {
  auto layout = FlatWeightLayout::Create(
      {{"model.embed_tokens.weight",
        v1::DTYPE_BF16,
        {rows, cols},
        static_cast<uint64_t>(rows * cols * 2)}},
      {.bucket_bytes = bucket_bytes, .alignment = 64});
  REQUIRE(layout.ok());
  std::mt19937_64 rng(seed);
  WeightBuffer weights(layout->total_bytes());
  testing::FillRandom(*layout, &weights, rng);
  REQUIRE(testing::PutFullVersion(store, *layout, weights, 1).ok());
  return {*std::move(layout), std::move(weights)};
}

// Every stream went over the path the receiver was asked to use.
void CheckPath(const GrpcPullReceiver& receiver, bool raw) {
  INFO("raw data path: " << raw);
  const PullStats stats = receiver.stats();
  if (raw) {
    CHECK(stats.raw_streams > 0);
    CHECK(stats.grpc_streams == 0);
  } else {
    CHECK(stats.raw_streams == 0);
    CHECK(stats.grpc_streams > 0);
  }
}

// Receives and commits until live reaches `target`.
void CatchUp(GrpcPullReceiver& receiver, StagingWeights& staging,
             uint64_t target, Clock* clock = RealClock()) {
  while (!staging.live_version().has_value() ||
         *staging.live_version() < target) {
    auto got = receiver.ReceiveNext(&staging, clock->Now() + absl::Seconds(20));
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    REQUIRE(staging.Commit().ok());
  }
}

TEST_CASE(
    "Pull path: a late joiner fetches one full copy, then follows "
    "deltas, bit for bit",
    "[weights][pull]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Loopback loop;
  Publisher trainer(layout, &loop.store());
  for (uint64_t v = 0; v <= 6; ++v) trainer.Step(v);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  const bool raw = GENERATE(true, false);
  INFO("raw data path: " << raw);
  GrpcPullReceiver receiver(
      loop.channel(),
      {.chunk_bytes = 1000, .raw_data = raw, .raw_chunk_bytes = 1000});
  CatchUp(receiver, **staging, 6);
  CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
  CHECK((*staging)->stats().full_versions == 1);
  for (uint64_t v = 7; v <= 11; ++v) {
    trainer.Step(v);
    CatchUp(receiver, **staging, v);
    REQUIRE(SameBytes((*staging)->live().bytes, trainer.current()));
  }
  // 7 and 9..11 are deltas on live; 8 is a scheduled anchor (full).
  CHECK((*staging)->stats().delta_versions == 4);
  CHECK((*staging)->stats().full_versions == 2);
  CHECK(receiver.stats().resumes == 0);
  CheckPath(receiver, raw);
}

TEST_CASE("Pull path resumes broken streams from the last verified byte",
          "[weights][pull]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Loopback loop;
  Publisher trainer(layout, &loop.store());
  trainer.Step(0);
  loop.service().FailStreamsAfterChunksForTest(3);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  const bool raw = GENERATE(true, false);
  INFO("raw data path: " << raw);
  GrpcPullReceiver receiver(loop.channel(), {.chunk_bytes = 1000,
                                             .max_attempts = 3,
                                             .raw_data = raw,
                                             .raw_chunk_bytes = 1000});
  CatchUp(receiver, **staging, 0);
  CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
  CHECK(receiver.stats().resumes > 5);
  CHECK(receiver.stats().bytes == layout.total_bytes());
  CheckPath(receiver, raw);
}

TEST_CASE("Pull path discards a corrupted chunk and refetches it",
          "[weights][pull]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Loopback loop;
  Publisher trainer(layout, &loop.store());
  trainer.Step(0);
  loop.service().CorruptChunkForTest(4);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  const bool raw = GENERATE(true, false);
  INFO("raw data path: " << raw);
  GrpcPullReceiver receiver(
      loop.channel(),
      {.chunk_bytes = 1000, .raw_data = raw, .raw_chunk_bytes = 1000});
  CatchUp(receiver, **staging, 0);
  CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
  CHECK(receiver.stats().chunk_crc_errors == 1);
  CHECK(receiver.stats().resumes == 1);
  CheckPath(receiver, raw);
}

TEST_CASE("Pull path rejects a version whose bucket fails verification",
          "[weights][pull]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Loopback loop;
  std::mt19937_64 rng(3);
  WeightBuffer good(layout.total_bytes());
  testing::FillRandom(layout, &good, rng);
  auto manifest = layout.BuildManifest(good.span(), 1);
  REQUIRE(manifest.ok());
  Bytes bad(good.data(), good.data() + good.size());
  bad[4096 + 9] ^= 0x04;  // the server's own copy is wrong in bucket 1
  REQUIRE(loop.store().Put(*manifest, std::make_shared<const Bytes>(bad)).ok());
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  const bool raw = GENERATE(true, false);
  INFO("raw data path: " << raw);
  GrpcPullReceiver receiver(loop.channel(), {.raw_data = raw});
  auto got = receiver.ReceiveNext(staging->get(), Soon());
  REQUIRE_FALSE(got.ok());
  CheckPath(receiver, raw);
  CHECK(absl::IsDataLoss(got.status()));
  CHECK(std::string(got.status().message()).find("bucket 1") !=
        std::string::npos);
  CHECK_FALSE((*staging)->ready());
  CHECK_FALSE((*staging)->Commit().ok());
  CHECK_FALSE((*staging)->live_version().has_value());
}

TEST_CASE("A transfer that has begun is not cut by a short waiting deadline",
          "[weights][pull]") {
  // 64 MiB in 1 KiB gRPC messages takes far longer than the 50 ms the
  // caller waits for a version: the receiver must finish it rather than
  // return DeadlineExceeded and start over at its next call.
  Loopback loop;
  const auto [layout, weights] =
      StoreOneTensorVersion(loop.store(), 8192, 4096, 4 << 20, 5);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  GrpcPullReceiver receiver(loop.channel(),
                            {.chunk_bytes = 1024, .raw_data = false});
  // On a loaded machine the first reply can take longer than 50 ms: such
  // a call ends before the transfer begins (DeadlineExceeded is right
  // then) and the next call starts it. A receiver that cut transfers at
  // the deadline would never finish 64 MiB within one 50 ms call.
  absl::StatusOr<uint64_t> got = absl::DeadlineExceededError("no call yet");
  absl::Duration took;
  for (int call = 0; call < 20 && !got.ok(); ++call) {
    const absl::Time start = absl::Now();
    got = receiver.ReceiveNext(staging->get(), start + absl::Milliseconds(50));
    took = absl::Now() - start;
    INFO("call " << call << ": " << got.status());
    if (!got.ok()) REQUIRE(absl::IsDeadlineExceeded(got.status()));
  }
  INFO(got.status());
  REQUIRE(got.ok());
  CHECK(*got == 1);
  INFO("transfer took " << absl::FormatDuration(took));
  CHECK(took > absl::Milliseconds(50));  // else the test proves nothing
  REQUIRE((*staging)->Commit().ok());
  CHECK(SameBytes((*staging)->live().bytes, weights));
}

TEST_CASE(
    "Pull receiver waits for a newer version until its deadline or "
    "Cancel",
    "[weights][pull]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  FakeClock clock;
  Loopback loop({.clock = &clock});
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  GrpcPullReceiver receiver(
      loop.channel(),
      {.poll_interval = absl::Milliseconds(10), .clock = &clock});
  const absl::Time start = clock.Now();
  CHECK(absl::IsDeadlineExceeded(
      ReceiveAdvancing(receiver, staging->get(), clock, absl::Milliseconds(50))
          .status()));
  CHECK(clock.Now() - start >= absl::Milliseconds(40));
  // Cancel while it pauses between two questions (nothing advances the
  // clock: only Cancel can end this wait).
  std::thread canceller([&] {
    REQUIRE(clock.WaitForWaiters(1));
    receiver.Cancel();
  });
  CHECK(absl::IsCancelled(
      receiver.ReceiveNext(staging->get(), clock.Now() + absl::Seconds(20))
          .status()));
  canceller.join();
}

TEST_CASE(
    "Interrupt ends a wait for a newer version, once, and the receiver "
    "goes on",
    "[weights][pull]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  // The server's long polls and the receiver's waits on one clock that
  // only the deadline step below advances.
  FakeClock clock;
  Loopback loop({.clock = &clock});
  Publisher trainer(layout, &loop.store());
  trainer.Step(0);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  GrpcPullReceiver receiver(loop.channel(), {.clock = &clock});
  CatchUp(receiver, **staging, 0, &clock);
  auto soon = [&] { return clock.Now() + absl::Seconds(20); };
  // The next long poll (the `polls`-th) is held by the server.
  auto held = [&](uint64_t polls) {
    return WaitUntil([&] {
      return loop.service().stats().long_polls == polls &&
             loop.service().held_long_polls() == 1;
    });
  };

  // Waiting (nothing newer than 0): an interrupt ends the wait at once,
  // with Cancelled, long before the 20 s deadline.
  uint64_t polls = loop.service().stats().long_polls;
  bool was_held = false;
  std::thread interrupter([&] {
    was_held = held(polls + 1);
    receiver.Interrupt();
  });
  absl::Time start = absl::Now();
  auto got = receiver.ReceiveNext(staging->get(), soon());
  const absl::Duration waited = absl::Now() - start;
  interrupter.join();
  INFO(got.status().ToString() << " after " << absl::FormatDuration(waited));
  CHECK(was_held);
  REQUIRE(absl::IsCancelled(got.status()));
  CHECK(std::string(got.status().message()).find("interrupted") !=
        std::string::npos);
  CHECK(waited < absl::Seconds(2));

  // It was taken by that wait: the next one runs to its deadline.
  start = clock.Now();
  got = ReceiveAdvancing(receiver, staging->get(), clock,
                         absl::Milliseconds(300));
  CHECK(absl::IsDeadlineExceeded(got.status()));
  CHECK(clock.Now() - start >= absl::Milliseconds(250));

  // An interrupt made between two calls ends the next wait (a wake just
  // before the call is not lost) ...
  receiver.Interrupt();
  start = absl::Now();
  got = receiver.ReceiveNext(staging->get(), soon());
  CHECK(absl::IsCancelled(got.status()));
  CHECK(absl::Now() - start < absl::Seconds(2));
  // ... but not a call that finds a newer version: it receives it.
  trainer.Step(1);
  receiver.Interrupt();
  got = receiver.ReceiveNext(staging->get(), soon());
  REQUIRE(got.ok());
  CHECK(*got == 1);
  REQUIRE((*staging)->Commit().ok());
  CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
  // Not Cancel(): the receiver still waits for and receives later ones.
  polls = loop.service().stats().long_polls;
  std::thread publisher([&] {
    was_held = held(polls + 1);
    trainer.Step(2);
  });
  got = receiver.ReceiveNext(staging->get(), soon());
  publisher.join();
  CHECK(was_held);
  REQUIRE(got.ok());
  CHECK(*got == 2);
  REQUIRE((*staging)->Commit().ok());
  CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
}

TEST_CASE("Interrupt during a transfer does not abort it", "[weights][pull]") {
  // 16 MiB in 1 KiB messages over FetchWeights: a transfer slow enough to
  // be interrupted many times while bytes arrive.
  Loopback loop;
  const auto [layout, weights] =
      StoreOneTensorVersion(loop.store(), 4096, 2048, 1 << 20, 11);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  GrpcPullReceiver receiver(loop.channel(),
                            {.chunk_bytes = 1024, .raw_data = false});
  std::atomic<bool> done{false};
  absl::StatusOr<uint64_t> got = absl::UnknownError("not run");
  std::thread pulling([&] {
    got = receiver.ReceiveNext(staging->get(), Soon());
    done = true;
  });
  // Interrupt only while the transfer is under way (some bytes arrived,
  // not all).
  int interrupts = 0;
  while (!done) {
    const uint64_t bytes = receiver.stats().bytes;
    if (bytes > 0 && bytes < layout.total_bytes()) {
      receiver.Interrupt();
      ++interrupts;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  pulling.join();
  INFO(interrupts << " interrupts during the transfer");
  CHECK(interrupts > 5);  // else the test proves nothing
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  CHECK(*got == 1);
  CHECK(receiver.stats().resumes == 0);
  REQUIRE((*staging)->Commit().ok());
  CHECK(SameBytes((*staging)->live().bytes, weights));
}

TEST_CASE(
    "Raw data path in whole buckets: resumes at the bucket, a corrupted "
    "bucket rejects the version",
    "[weights][pull]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  REQUIRE(layout.buckets().size() > 3);
  Loopback loop;
  Publisher trainer(layout, &loop.store());
  trainer.Step(0);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  // Default options: one chunk per bucket.
  GrpcPullReceiver receiver(loop.channel(), {.max_attempts = 3});
  SECTION("broken streams") {
    loop.service().FailStreamsAfterChunksForTest(2);
    CatchUp(receiver, **staging, 0);
    CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
    CHECK(receiver.stats().resumes >= layout.buckets().size() / 2 - 1);
    CHECK(loop.service().stats().chunks == layout.buckets().size());
  }
  SECTION("a corrupted bucket") {
    loop.service().CorruptChunkForTest(2);
    auto got = receiver.ReceiveNext(staging->get(), Soon());
    REQUIRE_FALSE(got.ok());
    CHECK(absl::IsDataLoss(got.status()));
    CHECK(std::string(got.status().message()).find("bucket 2") !=
          std::string::npos);
    CHECK_FALSE((*staging)->ready());
    // The next attempt (nothing corrupted any more) is committed.
    CatchUp(receiver, **staging, 0);
    CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
  }
  CheckPath(receiver, /*raw=*/true);
}

TEST_CASE(
    "Pull receiver reads FetchWeights from a server without a raw data "
    "path",
    "[weights][pull]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightServerOptions options;
  options.data_host = "";  // disabled: nothing announced
  Loopback loop(options);
  CHECK(loop.service().data_port() == 0);
  Publisher trainer(layout, &loop.store());
  trainer.Step(0);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  GrpcPullReceiver receiver(loop.channel(), {.chunk_bytes = 1000});
  CatchUp(receiver, **staging, 0);
  CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
  CheckPath(receiver, /*raw=*/false);
}

TEST_CASE("Raw data path answers bad requests with an error status",
          "[weights][pull]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Loopback loop;
  REQUIRE(loop.service().data_port() != 0);
  Publisher trainer(layout, &loop.store());
  trainer.Step(0);
  auto exchange = [&](const std::string& request) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(loop.service().data_port());
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(send(fd, request.data(), request.size(), 0) ==
            static_cast<ssize_t>(request.size()));
    std::string answer;
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) {
      answer.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return answer;
  };
  auto framed = [](uint32_t magic, const std::string& body) {
    std::string out(8, '\0');
    const uint32_t head[2] = {magic, static_cast<uint32_t>(body.size())};
    std::memcpy(out.data(), head, sizeof(head));
    return out + body;
  };
  auto code_of = [](const std::string& answer) {
    REQUIRE(answer.size() >= 12);
    uint32_t head[3];
    std::memcpy(head, answer.data(), sizeof(head));
    CHECK(head[0] == kRawMagic);
    return static_cast<absl::StatusCode>(head[1]);
  };
  // Not our protocol.
  std::string answer = exchange(framed(0xDEADBEEF, ""));
  CHECK(code_of(answer) == absl::StatusCode::kInvalidArgument);
  CHECK(answer.find("bad magic") != std::string::npos);
  // A version the server does not hold.
  v1::FetchWeightsRequest request;
  request.set_policy_version(42);
  answer = exchange(framed(kRawMagic, request.SerializeAsString()));
  CHECK(code_of(answer) == absl::StatusCode::kNotFound);
  // A resume point outside the payload.
  request.set_policy_version(0);
  request.set_start_offset(1u << 30);
  answer = exchange(framed(kRawMagic, request.SerializeAsString()));
  CHECK(code_of(answer) == absl::StatusCode::kInvalidArgument);
  CHECK(answer.find("outside weights v0") != std::string::npos);
}

TEST_CASE("WeightStore keeps the anchor and evicts old versions",
          "[weights][pull]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(/*retain_versions=*/3);
  Publisher trainer(layout, &store);
  for (uint64_t v = 0; v <= 7; ++v) trainer.Step(v);
  CHECK(store.latest_version() == 7u);
  CHECK(store.Get(4, v1::WEIGHT_PAYLOAD_KIND_FULL).ok());  // anchor of 7
  CHECK(store.Get(7, v1::WEIGHT_PAYLOAD_KIND_DELTA).ok());
  CHECK(absl::IsNotFound(store.Get(3, v1::WEIGHT_PAYLOAD_KIND_FULL).status()));
  CHECK(absl::IsNotFound(store.Manifest(2).status()));
  auto latest = store.Manifest(0);
  REQUIRE(latest.ok());
  CHECK(latest->policy_version() == 7);
  CHECK(latest->kind() == v1::WEIGHT_PAYLOAD_KIND_FULL);
}

TEST_CASE(
    "ManifestDigestSource fetches a stored version's SHA-256 and tree root "
    "from the trainer's GetManifest, and names a version it does not hold",
    "[weights][pull][digest]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  Loopback loop;
  std::mt19937_64 rng(5);
  WeightBuffer bytes(layout.total_bytes());
  testing::FillRandom(layout, &bytes, rng);
  auto manifest = layout.BuildManifest(bytes.span(), 3, /*with_sha256=*/true);
  REQUIRE(manifest.ok());
  auto tree = WeightTreeSha256(bytes.span());
  REQUIRE(tree.ok());
  manifest->set_tree_sha256(*tree);
  manifest->set_anchor_version(3);
  REQUIRE(loop.store()
              .Put(*manifest, std::make_shared<const Bytes>(
                                  bytes.data(), bytes.data() + bytes.size()))
              .ok());
  ManifestDigestSource source(loop.channel(), absl::Seconds(5));
  auto digests = source.TrustedDigests(3);
  REQUIRE(digests.ok());
  auto sha = WeightSha256(bytes.span());
  REQUIRE(sha.ok());
  CHECK(digests->sha256 == *sha);
  CHECK(digests->tree_sha256 == *tree);
  CHECK(digests->tree_sha256.size() == kWeightSha256Bytes);
  auto only_sha = source.TrustedSha256(3);
  REQUIRE(only_sha.ok());
  CHECK(*only_sha == *sha);
  auto missing = source.TrustedDigests(9);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("GetManifest(v9)"));
}

}  // namespace
}  // namespace tandem::weights
