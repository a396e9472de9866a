// The same-host shared-memory pull path: a WeightServerService with
// shared_memory on offers FULL versions as /dev/shm segments, a
// GrpcPullReceiver maps and copies them into StagingWeights (real gRPC
// server on a loopback port, real shm objects). Offers travel over the raw
// data path and over FetchWeights.

#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/shared_weight_segment.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "weight_server_test_util.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using Bytes = std::vector<uint8_t>;

// The names under /dev/shm starting with `stem` (a store's name stem).
std::vector<std::string> SegmentsOf(const std::string& stem) {
  std::vector<std::string> out;
  DIR* d = opendir("/dev/shm");
  REQUIRE(d != nullptr);
  const std::string prefix = stem.substr(1);  // no leading '/'
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).rfind(prefix, 0) == 0) {
      out.push_back(e->d_name);
    }
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// Segments are unlinked when the last reference to their version goes,
// and a server thread may still hold one for a moment after the receiver
// has its bytes (longer on a loaded machine): these poll the listing until
// it is `want` (or has `count` names), for 10 s at most, and return the
// last listing for the caller's CHECK.
std::vector<std::string> SegmentsOf(const std::string& stem,
                                    const std::vector<std::string>& want) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<std::string> now = SegmentsOf(stem);
  while (now != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    now = SegmentsOf(stem);
  }
  return now;
}

std::vector<std::string> SegmentsOf(const std::string& stem, size_t count) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<std::string> now = SegmentsOf(stem);
  while (now.size() != count && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    now = SegmentsOf(stem);
  }
  return now;
}

// A weight server (shared memory on unless told otherwise) on a port-0
// gRPC server over `store`, which must outlive it.
class Server : public testing::WeightServerLoopback {
 public:
  Server(WeightStore* store, bool shared_memory = true)
      : WeightServerLoopback(store, {.shared_memory = shared_memory}) {}
};

// Publishes random FULL versions (each its own anchor) like the trainer.
class FullPublisher {
 public:
  FullPublisher(const FlatWeightLayout& layout, WeightStore* store)
      : layout_(layout), store_(store), current_(layout.total_bytes()) {}

  // `anchor`: the manifest's anchor_version (0: v itself).
  void Publish(uint64_t v, uint64_t anchor = 0) {
    testing::FillRandom(layout_, &current_, rng_);
    auto manifest = layout_.BuildManifest(current_.span(), v);
    REQUIRE(manifest.ok());
    manifest->set_anchor_version(anchor == 0 ? v : anchor);
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
  std::mt19937_64 rng_{11};
  WeightBuffer current_;
};

bool SameBytes(absl::Span<const uint8_t> a, const WeightBuffer& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

// Receives one version and commits it.
void ReceiveAndCommit(GrpcPullReceiver& receiver, StagingWeights& staging,
                      uint64_t expect) {
  auto got = receiver.ReceiveNext(&staging, Soon());
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  CHECK(*got == expect);
  REQUIRE(staging.Commit().ok());
}

TEST_CASE(
    "Shared-memory pull: versions arrive bit for bit through /dev/shm, "
    "not the socket",
    "[weights][pull][shm]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(16);
  Server server(&store);
  FullPublisher trainer(layout, &store);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  const bool raw = GENERATE(true, false);
  INFO("offer over the raw data path: " << raw);
  GrpcPullReceiver receiver(server.channel(), {.raw_data = raw});
  constexpr uint64_t kVersions = 5;
  for (uint64_t v = 1; v <= kVersions; ++v) {
    trainer.Publish(v);
    ReceiveAndCommit(receiver, **staging, v);
    REQUIRE(SameBytes((*staging)->live().bytes, trainer.current()));
    CHECK(SegmentsOf(store.segment_name_stem(), size_t{v}).size() == v);
  }
  const PullStats stats = receiver.stats();
  CHECK(stats.shm_versions == kVersions);
  CHECK(stats.shm_bytes == kVersions * layout.total_bytes());
  CHECK(stats.shm_fallbacks() == 0);
  // The offers came over the path asked for.
  CHECK((raw ? stats.raw_streams : stats.grpc_streams) >= kVersions);
  CHECK((raw ? stats.grpc_streams : stats.raw_streams) == 0);
  CHECK(server.service().stats().shm_offers == kVersions);
  CHECK(server.service().stats().bytes == 0);  // nothing streamed
}

TEST_CASE(
    "Shared-memory pull: a segment corrupted after the server made it "
    "fails the bucket CRC and the version is not committed",
    "[weights][pull][shm]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  REQUIRE(layout.buckets().size() > 2);
  WeightStore store(16);
  Server server(&store);
  FullPublisher trainer(layout, &store);
  trainer.Publish(1);
  // The segment the server offers for v1 (made on the first request).
  auto segment = store.SharedFull(1);
  REQUIRE(segment.ok());
  const int fd = open(("/dev/shm" + (*segment)->name()).c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t byte = 0;
  const off_t at = kSegmentHeaderBytes + layout.buckets()[2].offset + 5;
  REQUIRE(pread(fd, &byte, 1, at) == 1);
  byte ^= 0x20;
  REQUIRE(pwrite(fd, &byte, 1, at) == 1);
  close(fd);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  GrpcPullReceiver receiver(server.channel(), {});
  auto got = receiver.ReceiveNext(staging->get(), Soon());
  REQUIRE_FALSE(got.ok());
  CHECK(absl::IsDataLoss(got.status()));
  CHECK(std::string(got.status().message()).find("bucket 2") !=
        std::string::npos);
  CHECK(receiver.stats().shm_versions == 0);
  CHECK(server.service().stats().shm_offers == 1);
  CHECK_FALSE((*staging)->ready());
  CHECK_FALSE((*staging)->Commit().ok());
  CHECK_FALSE((*staging)->live_version().has_value());
}

TEST_CASE(
    "Shared-memory pull falls back to the socket: shm off, or a segment "
    "that cannot be opened or is not the one offered",
    "[weights][pull][shm]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(16);
  const bool raw = GENERATE(true, false);
  INFO("raw data path: " << raw);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());

  SECTION("the client does not ask") {
    Server server(&store);
    FullPublisher trainer(layout, &store);
    trainer.Publish(1);
    GrpcPullReceiver receiver(server.channel(),
                              {.raw_data = raw, .shared_memory = false});
    ReceiveAndCommit(receiver, **staging, 1);
    CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
    CHECK(receiver.stats().shm_versions == 0);
    CHECK(server.service().stats().shm_offers == 0);
    CHECK(server.service().stats().bytes == layout.total_bytes());
    CHECK(receiver.stats().shm_not_offered == 0);
    CHECK(SegmentsOf(store.segment_name_stem(), size_t{0}).empty());
  }
  SECTION("the server does not offer") {
    Server server(&store, /*shared_memory=*/false);
    FullPublisher trainer(layout, &store);
    trainer.Publish(1);
    GrpcPullReceiver receiver(server.channel(), {.raw_data = raw});
    ReceiveAndCommit(receiver, **staging, 1);
    CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
    CHECK(receiver.stats().shm_versions == 0);
    CHECK(receiver.stats().shm_fallbacks() == 0);
    CHECK(receiver.stats().shm_not_offered == 1);
    CHECK(server.service().stats().bytes == layout.total_bytes());
    // Asked again for the next version: not offered again.
    trainer.Publish(2);
    ReceiveAndCommit(receiver, **staging, 2);
    CHECK(receiver.stats().shm_not_offered == 2);
  }
  SECTION("the offered segment is not here, or is another one") {
    Server server(&store);
    FullPublisher trainer(layout, &store);
    trainer.Publish(1);
    auto segment = store.SharedFull(1);
    REQUIRE(segment.ok());
    const std::string path = "/dev/shm" + (*segment)->name();
    REQUIRE(unlink(path.c_str()) == 0);  // as if on another host
    const bool impostor = GENERATE(false, true);
    INFO("same-named object of another host: " << impostor);
    if (impostor) {
      // Same name and size, but not the server's (no matching token).
      const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
      REQUIRE(fd >= 0);
      REQUIRE(ftruncate(fd, static_cast<off_t>((*segment)->size())) == 0);
      close(fd);
    }
    GrpcPullReceiver receiver(server.channel(), {.raw_data = raw});
    ReceiveAndCommit(receiver, **staging, 1);
    CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
    CHECK(receiver.stats().shm_fallbacks() == 1);
    CHECK(receiver.stats().shm_mismatches == (impostor ? 1 : 0));
    CHECK(receiver.stats().shm_open_failures == (impostor ? 0 : 1));
    CHECK(receiver.stats().shm_not_offered == 0);
    CHECK(receiver.stats().shm_versions == 0);
    CHECK(server.service().stats().shm_offers == 1);
    CHECK(server.service().stats().bytes == layout.total_bytes());
    // Later versions go straight to the socket: no more offers asked for.
    trainer.Publish(2);
    ReceiveAndCommit(receiver, **staging, 2);
    CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
    CHECK(server.service().stats().shm_offers == 1);
    CHECK(receiver.stats().shm_fallbacks() == 1);
    // The receiver stopped asking: nothing "not offered" either.
    CHECK(receiver.stats().shm_not_offered == 0);
    if (impostor) unlink(path.c_str());
  }
}

TEST_CASE(
    "Shared-memory segments are unlinked on eviction and when the server "
    "is destroyed",
    "[weights][pull][shm]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(/*retain_versions=*/2);
  FullPublisher trainer(layout, &store);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  const std::string stem = store.segment_name_stem();
  {
    Server server(&store);
    GrpcPullReceiver receiver(server.channel(), {});
    trainer.Publish(1);
    ReceiveAndCommit(receiver, **staging, 1);
    trainer.Publish(2);
    ReceiveAndCommit(receiver, **staging, 2);
    CHECK(SegmentsOf(stem, std::vector<std::string>{stem.substr(1) + "-v1",
                                                    stem.substr(1) + "-v2"}) ==
          std::vector<std::string>{stem.substr(1) + "-v1",
                                   stem.substr(1) + "-v2"});
    trainer.Publish(3);  // evicts v1 (retain 2)
    CHECK(SegmentsOf(stem, std::vector<std::string>{stem.substr(1) + "-v2"}) ==
          std::vector<std::string>{stem.substr(1) + "-v2"});
    ReceiveAndCommit(receiver, **staging, 3);
    CHECK(SegmentsOf(stem, size_t{2}).size() == 2);
    CHECK(receiver.stats().shm_versions == 3);
  }
  // The store (the trainer's) lives on; the server's segments do not.
  CHECK(store.latest_version() == 3);
  CHECK(SegmentsOf(stem, size_t{0}).empty());
}

// ---- Segments made at publish (WeightStore::SharedMemory::kAtPut) ----

using SharedMemory = WeightStore::SharedMemory;

// The name of `stem`'s segment of version v, as listed in /dev/shm.
std::string SegmentName(const std::string& stem, uint64_t v) {
  return absl::StrCat(stem.substr(1), "-v", v);
}

TEST_CASE(
    "Shared memory at publish: Put makes each full version's segment, "
    "offers copy nothing, and workers get every version bit for bit",
    "[weights][pull][shm]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(16, SharedMemory::kAtPut);
  Server server(&store);
  FullPublisher trainer(layout, &store);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  const bool raw = GENERATE(true, false);
  INFO("offer over the raw data path: " << raw);
  GrpcPullReceiver receiver(server.channel(), {.raw_data = raw});
  const std::string stem = store.segment_name_stem();
  constexpr uint64_t kVersions = 6;
  for (uint64_t v = 1; v <= kVersions; ++v) {
    trainer.Publish(v);
    // Made by Put, before anyone asked; only the newest two are kept
    // (each version is its own anchor here).
    std::vector<std::string> kept = {SegmentName(stem, v)};
    if (v > 1) kept.insert(kept.begin(), SegmentName(stem, v - 1));
    CHECK(SegmentsOf(stem, kept) == kept);
    auto made = store.SharedFull(v);
    REQUIRE(made.ok());
    ReceiveAndCommit(receiver, **staging, v);
    REQUIRE(SameBytes((*staging)->live().bytes, trainer.current()));
    // The offer was the segment Put made, not a new copy.
    auto offered = store.SharedFull(v);
    REQUIRE(offered.ok());
    CHECK(offered->get() == made->get());
  }
  const PullStats stats = receiver.stats();
  CHECK(stats.shm_versions == kVersions);
  CHECK(stats.shm_bytes == kVersions * layout.total_bytes());
  CHECK(stats.shm_fallbacks() == 0);
  CHECK(stats.shm_not_offered == 0);
  CHECK(server.service().stats().shm_offers == kVersions);
  CHECK(server.service().stats().bytes == 0);  // nothing streamed
}

TEST_CASE(
    "Shared memory at publish keeps the segments of the two newest full "
    "versions and the newest anchor only, and never makes one on request",
    "[weights][pull][shm]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(/*retain_versions=*/8, SharedMemory::kAtPut);
  FullPublisher trainer(layout, &store);
  const std::string stem = store.segment_name_stem();
  trainer.Publish(1);     // an anchor
  trainer.Publish(2, 1);  // full copies of versions after anchor 1
  trainer.Publish(3, 1);
  trainer.Publish(4, 1);
  CHECK(SegmentsOf(stem, std::vector<std::string>{SegmentName(stem, 1),
                                                  SegmentName(stem, 3),
                                                  SegmentName(stem, 4)}) ==
        std::vector<std::string>{SegmentName(stem, 1), SegmentName(stem, 3),
                                 SegmentName(stem, 4)});
  // v2 is retained in full, but not in shared memory: NotFound, and asking
  // does not make it (the weight server streams it instead).
  REQUIRE(store.Get(2, v1::WEIGHT_PAYLOAD_KIND_FULL).ok());
  auto v2 = store.SharedFull(2);
  CHECK(absl::IsNotFound(v2.status()));
  CHECK(SegmentsOf(stem, size_t{3}).size() == 3);
  trainer.Publish(5);  // a new anchor: anchor 1's segment goes too
  CHECK(SegmentsOf(stem, std::vector<std::string>{SegmentName(stem, 4),
                                                  SegmentName(stem, 5)}) ==
        std::vector<std::string>{SegmentName(stem, 4), SegmentName(stem, 5)});
  // The payload put again for the same version replaces its segment.
  trainer.Publish(5);
  CHECK(SegmentsOf(stem, std::vector<std::string>{SegmentName(stem, 4),
                                                  SegmentName(stem, 5)}) ==
        std::vector<std::string>{SegmentName(stem, 4), SegmentName(stem, 5)});
  auto again = store.SharedFull(5);
  REQUIRE(again.ok());
  auto mapped =
      MappedWeightSegment::Open((*again)->name(), (*again)->size(),
                                (*again)->token(), 5, layout.total_bytes());
  REQUIRE(mapped.ok());
  CHECK(SameBytes((*mapped)->payload(), trainer.current()));
}

TEST_CASE(
    "Shared memory at publish: segments are unlinked on eviction and on "
    "shutdown, and a reader that mapped one keeps reading its bytes",
    "[weights][pull][shm]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  std::string stem;
  {
    WeightStore store(/*retain_versions=*/2, SharedMemory::kAtPut);
    stem = store.segment_name_stem();
    FullPublisher trainer(layout, &store);
    trainer.Publish(1);
    const std::vector<uint8_t> v1_bytes(
        trainer.current().data(),
        trainer.current().data() + trainer.current().size());
    // A reader maps v1 as a worker does after the offer ...
    auto offer = store.SharedFull(1);
    REQUIRE(offer.ok());
    auto mapped =
        MappedWeightSegment::Open((*offer)->name(), (*offer)->size(),
                                  (*offer)->token(), 1, layout.total_bytes());
    REQUIRE(mapped.ok());
    offer = absl::NotFoundError("released");  // the server's reference
    // ... then v2 and v3 are published: v1 is evicted (retain 2) and its
    // segment unlinked.
    trainer.Publish(2);
    trainer.Publish(3);
    CHECK(SegmentsOf(stem, std::vector<std::string>{SegmentName(stem, 2),
                                                    SegmentName(stem, 3)}) ==
          std::vector<std::string>{SegmentName(stem, 2), SegmentName(stem, 3)});
    CHECK_FALSE(store.Get(1, v1::WEIGHT_PAYLOAD_KIND_FULL).ok());
    // The unlinked segment's mapping still holds v1, bit for bit.
    REQUIRE((*mapped)->payload().size() == v1_bytes.size());
    CHECK(std::memcmp((*mapped)->payload().data(), v1_bytes.data(),
                      v1_bytes.size()) == 0);
    // A worker offered a segment that is gone by the time it opens it
    // falls back to the socket and still gets the version.
    auto v3 = store.SharedFull(3);
    REQUIRE(v3.ok());
    REQUIRE(shm_unlink((*v3)->name().c_str()) == 0);
    {
      Server server(&store);
      GrpcPullReceiver receiver(server.channel(), {});
      ReceiveAndCommit(receiver, **staging, 3);
      CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
      CHECK(receiver.stats().shm_open_failures == 1);
      CHECK(receiver.stats().shm_versions == 0);
      trainer.Publish(4);
      CHECK(SegmentsOf(stem, std::vector<std::string>{SegmentName(stem, 4)}) ==
            std::vector<std::string>{SegmentName(stem, 4)});
    }
    // The server's shutdown unlinked what the store had shared.
    CHECK(SegmentsOf(stem, size_t{0}).empty());
    // The trainer publishes on after its weight server stopped (shutdown
    // order): the store's destruction unlinks that one.
    trainer.Publish(5);
    CHECK(SegmentsOf(stem, std::vector<std::string>{SegmentName(stem, 5)}) ==
          std::vector<std::string>{SegmentName(stem, 5)});
  }
  CHECK(SegmentsOf(stem, size_t{0}).empty());
}

TEST_CASE(
    "A starting weight server removes stale segments of dead processes of "
    "its pid namespace only",
    "[weights][pull][shm]") {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(child > 0);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  struct stat ns {};
  REQUIRE(stat("/proc/self/ns/pid", &ns) == 0);
  const std::string dead =
      absl::StrCat("tandem-w-", child, "-", ns.st_ino, "-0badc0de-v3");
  const std::string live =
      absl::StrCat("tandem-w-", getpid(), "-", ns.st_ino, "-0badc0de-v3");
  const std::string other_ns =
      absl::StrCat("tandem-w-", child, "-", ns.st_ino + 1, "-0badc0de-v3");
  for (const std::string& name : {dead, live, other_ns}) {
    const int fd = shm_open(("/" + name).c_str(), O_RDWR | O_CREAT, 0600);
    REQUIRE(fd >= 0);
    close(fd);
  }
  auto exists = [](const std::string& name) {
    return access(("/dev/shm/" + name).c_str(), F_OK) == 0;
  };
  {
    WeightStore store(2);
    Server server(&store);
    CHECK_FALSE(exists(dead));
    CHECK(exists(live));
    CHECK(exists(other_ns));
  }
  shm_unlink(("/" + dead).c_str());
  shm_unlink(("/" + live).c_str());
  shm_unlink(("/" + other_ns).c_str());
}

}  // namespace
}  // namespace tandem::weights

namespace tandem::weights {
namespace {

// A segment made by Create, with the arguments Open needs.
struct MadeSegment {
  std::unique_ptr<SharedWeightSegment> segment;
  std::vector<uint8_t> payload;
  std::string path;
};

MadeSegment MakeSegment(uint64_t version) {
  MadeSegment made;
  made.payload.assign(8192, 0x5a);
  auto segment = SharedWeightSegment::Create(
      absl::StrCat(SharedWeightSegment::NewNameStem(), "-v", version), version,
      made.payload);
  REQUIRE(segment.ok());
  made.segment = *std::move(segment);
  made.path = SegmentPath(made.segment->name());
  return made;
}

absl::Status OpenMade(const MadeSegment& made, uint64_t version) {
  return MappedWeightSegment::Open(made.segment->name(), made.segment->size(),
                                   made.segment->token(), version,
                                   made.payload.size())
      .status();
}

TEST_CASE("Segments are created 0600, owned by this user",
          "[weights][shm][access]") {
  MadeSegment made = MakeSegment(3);
  struct stat st {};
  REQUIRE(stat(made.path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  CHECK(st.st_uid == geteuid());
  CHECK(OpenMade(made, 3).ok());
}

TEST_CASE("A segment readable by others is refused, naming path and mode",
          "[weights][shm][access]") {
  MadeSegment made = MakeSegment(4);
  for (mode_t mode : {0644, 0640, 0604, 0400, 0700}) {
    INFO("mode " << std::oct << mode);
    REQUIRE(chmod(made.path.c_str(), mode) == 0);
    const absl::Status status = OpenMade(made, 4);
    CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
    char octal[8];
    std::snprintf(octal, sizeof(octal), "%04o", static_cast<unsigned>(mode));
    CHECK(std::string(status.message()) ==
          absl::StrCat("weight segment ", made.path, " has mode ", octal,
                       " and owner uid ", geteuid(), "; only 0600 and owner "
                       "uid ", geteuid(), " (this process's user) are accepted"));
  }
  REQUIRE(chmod(made.path.c_str(), 0600) == 0);
  CHECK(OpenMade(made, 4).ok());
}

TEST_CASE("A segment of another owner is refused, naming the owner",
          "[weights][shm][access]") {
  // The check itself, for any uid.
  const absl::Status status =
      CheckSegmentOwnerAndMode("/dev/shm/tandem-w-x", 0100600, 1234, 1000);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(status.message()) ==
        "weight segment /dev/shm/tandem-w-x has mode 0600 and owner uid "
        "1234; only 0600 and owner uid 1000 (this process's user) are "
        "accepted");
  CHECK(CheckSegmentOwnerAndMode("/dev/shm/tandem-w-x", 0100600, 1000, 1000)
            .ok());
  // A real object handed to another user: only root can chown it.
  if (geteuid() != 0) {
    WARN("not root: the chown half of this test needs root");
    return;
  }
  MadeSegment made = MakeSegment(5);
  REQUIRE(chown(made.path.c_str(), 65534, 65534) == 0);
  const absl::Status opened = OpenMade(made, 5);
  CHECK(opened.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(opened.message()).find("owner uid 65534") !=
        std::string::npos);
  CHECK(std::string(opened.message()).find(made.path) != std::string::npos);
}

}  // namespace
}  // namespace tandem::weights
