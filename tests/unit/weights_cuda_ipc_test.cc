// The CUDA IPC pull path without a device: the negotiation between a
// WeightServerService with a DeviceVersionRing and a GrpcPullReceiver with
// a CudaIpcSink (real gRPC server on a loopback port), the offer's checks,
// the leases tied to the FetchWeights call and the ring's eviction. The
// "device" here is host memory: HostIpcSink opens a handle by looking it up
// among the buffers this test allocated (as cudaIpcOpenMemHandle finds a
// live allocation), so everything but the CUDA runtime calls is the code a
// GPU runs (tests/gpu/cuda_ipc_test.cc runs those).

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/cuda_ipc.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "host_ipc_sink.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"
#include "weight_server_test_util.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using host_ipc::Bytes;
using host_ipc::HostAllocations;
using host_ipc::HostIpcSink;
using host_ipc::kDevice;

// Publishes random FULL versions into the store and, like the trainer on a
// CUDA device, into the ring.
class Trainer {
 public:
  Trainer(const FlatWeightLayout& layout, WeightStore* store,
          DeviceVersionRing* ring, HostAllocations* allocations)
      : layout_(layout),
        store_(store),
        ring_(ring),
        allocations_(allocations),
        current_(layout.total_bytes()) {}

  // `mangle` changes the offer before the ring holds it.
  void Publish(uint64_t v,
               const std::function<void(v1::CudaIpcOffer&)>& mangle = {}) {
    testing::FillRandom(layout_, &current_, rng_);
    auto manifest = layout_.BuildManifest(current_.span(), v);
    REQUIRE(manifest.ok());
    REQUIRE(store_
                ->Put(*manifest,
                      std::make_shared<const Bytes>(
                          current_.data(), current_.data() + current_.size()))
                .ok());
    if (ring_ != nullptr) {
      auto buffer =
          allocations_->Allocate(v, current_.span(), ring_->deferred_frees());
      if (mangle) mangle(buffer->offer);
      ring_->Put(buffer);
    }
  }
  const WeightBuffer& current() const { return current_; }

 private:
  const FlatWeightLayout& layout_;
  WeightStore* store_;
  DeviceVersionRing* ring_;
  HostAllocations* allocations_;
  std::mt19937_64 rng_{23};
  WeightBuffer current_;
};

bool SameBytes(absl::Span<const uint8_t> a, const WeightBuffer& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

void ReceiveAndCommit(GrpcPullReceiver& receiver, StagingWeights& staging,
                      uint64_t expect) {
  auto got = receiver.ReceiveNext(&staging, Soon());
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  CHECK(*got == expect);
  REQUIRE(staging.Commit().ok());
}

// Leases end when the server's reactor is done, a moment after the client
// ended the call (longer on a loaded machine): polls for 10 s at most.
uint64_t LeasesAfterSettling(const WeightServerService& service,
                             uint64_t want) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  uint64_t now = service.stats().cuda_ipc_leases;
  while (now != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    now = service.stats().cuda_ipc_leases;
  }
  return now;
}

template <typename T>
bool ExpiresWithin10s(const std::weak_ptr<T>& p) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!p.expired() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return p.expired();
}

v1::WeightManifest ManifestOfSize(uint64_t version, uint64_t total_bytes) {
  v1::WeightManifest m;
  m.set_policy_version(version);
  m.set_total_bytes(total_bytes);
  return m;
}

v1::CudaIpcOffer GoodOffer(uint64_t size) {
  v1::CudaIpcOffer offer;
  offer.set_handle(std::string(kCudaIpcHandleBytes, 'h'));
  offer.set_token(std::string(kCudaIpcTokenBytes, 't'));
  offer.set_size(size);
  offer.set_boot_id(LocalBootId());
  offer.set_device_uuid(kDevice);
  return offer;
}

TEST_CASE(
    "CUDA IPC pull: offered versions arrive bit for bit with no byte "
    "streamed, and every lease ends with its call",
    "[weights][pull][cuda_ipc]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(16);
  HostAllocations allocations;  // outlives the ring's deferred frees
  DeviceVersionRing ring(2);
  testing::WeightServerLoopback server(&store, {.cuda_ipc = &ring});
  Trainer trainer(layout, &store, &ring, &allocations);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  HostIpcSink sink(&allocations);
  // The raw data path is on: an IPC request still goes over FetchWeights.
  GrpcPullReceiver receiver(server.channel(),
                            {.raw_data = true, .cuda_ipc = &sink});
  constexpr uint64_t kVersions = 5;
  for (uint64_t v = 1; v <= kVersions; ++v) {
    trainer.Publish(v);
    ReceiveAndCommit(receiver, **staging, v);
    REQUIRE(SameBytes((*staging)->live().bytes, trainer.current()));
  }
  const PullStats stats = receiver.stats();
  CHECK(stats.cuda_ipc_versions == kVersions);
  CHECK(stats.cuda_ipc_bytes == kVersions * layout.total_bytes());
  CHECK(stats.cuda_ipc_refused + stats.cuda_ipc_open_failures == 0);
  CHECK(stats.cuda_ipc_not_offered == 0);
  CHECK(sink.copies == static_cast<int>(kVersions));
  CHECK(server.service().stats().cuda_ipc_offers == kVersions);
  CHECK(server.service().stats().bytes == 0);  // nothing streamed
  CHECK(server.service().stats().data_connections == 0);
  CHECK(LeasesAfterSettling(server.service(), 0) == 0);
}

TEST_CASE(
    "CUDA IPC pull, handoff mode: an offered version is left in the sink, "
    "nothing staged, its manifest handed over once; a version not offered "
    "is staged as before",
    "[weights][pull][cuda_ipc]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(16);
  HostAllocations allocations;  // outlives the ring's deferred frees
  DeviceVersionRing ring(2);
  testing::WeightServerLoopback server(&store, {.cuda_ipc = &ring});
  Trainer trainer(layout, &store, &ring, &allocations);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  HostIpcSink sink(&allocations);
  sink.hand_over = true;
  GrpcPullReceiver receiver(server.channel(),
                            {.cuda_ipc = &sink, .cuda_ipc_handoff = true});
  trainer.Publish(1);
  auto got = receiver.ReceiveNext(staging->get(), Soon());
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  CHECK(*got == 1);
  CHECK_FALSE((*staging)->ready());
  CHECK((*staging)->stats().bytes_received == 0);
  const std::optional<v1::WeightManifest> handed =
      receiver.TakeCudaIpcHandoff();
  REQUIRE(handed.has_value());
  CHECK(handed->policy_version() == 1);
  CHECK_FALSE(receiver.TakeCudaIpcHandoff().has_value());  // once
  const StagedIpcCopy copy = sink.TakeStagedCopy();
  REQUIRE(copy.memory != nullptr);
  CHECK(copy.bytes == layout.total_bytes());
  CHECK(std::memcmp(copy.memory.get(), trainer.current().data(), copy.bytes) ==
        0);
  CHECK(receiver.stats().cuda_ipc_versions == 1);
  CHECK(receiver.stats().cuda_ipc_bytes == layout.total_bytes());
  // The caller brings the staging to the version (as the subscriber does),
  // then a version the server does not offer is staged as usual.
  REQUIRE((*staging)
              ->CommitVerifiedElsewhere(
                  *handed,
                  [&](absl::Span<uint8_t> dst) {
                    std::memcpy(dst.data(), copy.memory.get(), dst.size());
                    return absl::OkStatus();
                  })
              .ok());
  Trainer host_only(layout, &store, nullptr, &allocations);
  host_only.Publish(2);
  ReceiveAndCommit(receiver, **staging, 2);
  CHECK(SameBytes((*staging)->live().bytes, host_only.current()));
  CHECK_FALSE(receiver.TakeCudaIpcHandoff().has_value());
  CHECK(receiver.stats().cuda_ipc_not_offered == 1);
}

TEST_CASE(
    "CUDA IPC pull: while offers work, each version is fetched in full by "
    "CUDA IPC instead of as a delta; after one is not offered, deltas again",
    "[weights][pull][cuda_ipc]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(16);
  HostAllocations allocations;  // outlives the ring's deferred frees
  DeviceVersionRing ring(2);
  testing::WeightServerLoopback server(&store, {.cuda_ipc = &ring});
  std::mt19937_64 rng(5);
  WeightBuffer current(layout.total_bytes());
  testing::FillRandom(layout, &current, rng);
  // Like the trainer: version 0 is the anchor; later ones are stored as a
  // delta on v-1 and in full; `device`: also in the ring.
  auto publish = [&](uint64_t v, bool device) {
    const Bytes previous(current.data(), current.data() + current.size());
    if (v > 0) testing::Perturb(layout, &current, rng, 0.02);
    auto manifest = layout.BuildManifest(current.span(), v);
    REQUIRE(manifest.ok());
    manifest->set_anchor_version(0);
    if (v > 0) {
      auto delta = kernels::EncodeBf16Delta(kernels::AsWords(previous),
                                            kernels::AsWords(current.span()));
      REQUIRE(delta.ok());
      v1::WeightManifest dm = *manifest;
      dm.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
      dm.set_base_version(v - 1);
      REQUIRE(
          store.Put(dm, std::make_shared<const Bytes>(*std::move(delta))).ok());
    }
    REQUIRE(store
                .Put(*manifest,
                     std::make_shared<const Bytes>(
                         current.data(), current.data() + current.size()))
                .ok());
    if (device) ring.Put(allocations.Allocate(v, current.span()));
  };
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  HostIpcSink sink(&allocations);
  GrpcPullReceiver receiver(server.channel(), {.cuda_ipc = &sink});
  for (uint64_t v = 0; v <= 3; ++v) {
    publish(v, /*device=*/true);
    ReceiveAndCommit(receiver, **staging, v);
    REQUIRE(SameBytes((*staging)->live().bytes, current));
  }
  CHECK(receiver.stats().cuda_ipc_versions == 4);
  CHECK((*staging)->stats().delta_versions == 0);
  // v4 is not in device memory (not offered): fetched in full over the
  // socket, and from then on the receiver follows deltas.
  publish(4, /*device=*/false);
  ReceiveAndCommit(receiver, **staging, 4);
  CHECK(SameBytes((*staging)->live().bytes, current));
  CHECK(receiver.stats().cuda_ipc_not_offered == 1);
  publish(5, /*device=*/true);
  ReceiveAndCommit(receiver, **staging, 5);
  CHECK(SameBytes((*staging)->live().bytes, current));
  CHECK((*staging)->stats().delta_versions == 1);
  CHECK(receiver.stats().cuda_ipc_versions == 4);
}

TEST_CASE(
    "CUDA IPC negotiation: a CPU client never asks, a CPU trainer never "
    "offers, and both stream the same bytes",
    "[weights][pull][cuda_ipc]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(16);
  HostAllocations allocations;
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  const bool raw = GENERATE(true, false);
  INFO("raw data path: " << raw);

  SECTION("a client without a sink (CPU worker) does not ask") {
    DeviceVersionRing ring(2);
    testing::WeightServerLoopback server(&store, {.cuda_ipc = &ring});
    Trainer trainer(layout, &store, &ring, &allocations);
    trainer.Publish(1);
    GrpcPullReceiver receiver(server.channel(), {.raw_data = raw});
    ReceiveAndCommit(receiver, **staging, 1);
    CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
    CHECK(server.service().stats().cuda_ipc_offers == 0);
    CHECK(server.service().stats().bytes == layout.total_bytes());
    CHECK(receiver.stats().cuda_ipc_not_offered == 0);
  }
  SECTION("a server without a ring (CPU trainer) does not offer") {
    testing::WeightServerLoopback server(&store, {});
    Trainer trainer(layout, &store, nullptr, &allocations);
    HostIpcSink sink(&allocations);
    GrpcPullReceiver receiver(server.channel(),
                              {.raw_data = raw, .cuda_ipc = &sink});
    for (uint64_t v = 1; v <= 2; ++v) {
      trainer.Publish(v);
      ReceiveAndCommit(receiver, **staging, v);
      CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
    }
    CHECK(sink.copies == 0);
    CHECK(receiver.stats().cuda_ipc_not_offered == 2);
    CHECK(receiver.stats().cuda_ipc_versions == 0);
    CHECK(server.service().stats().bytes == 2 * layout.total_bytes());
  }
  SECTION("a client on another host (boot id) is not offered") {
    DeviceVersionRing ring(2);
    testing::WeightServerLoopback server(&store, {.cuda_ipc = &ring});
    Trainer trainer(layout, &store, &ring, &allocations);
    trainer.Publish(1);
    HostIpcSink sink(&allocations);
    const_cast<v1::CudaIpcPeer&>(sink.peer()).set_boot_id("another-host");
    GrpcPullReceiver receiver(server.channel(),
                              {.raw_data = raw, .cuda_ipc = &sink});
    ReceiveAndCommit(receiver, **staging, 1);
    CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
    CHECK(server.service().stats().cuda_ipc_offers == 0);
    CHECK(receiver.stats().cuda_ipc_not_offered == 1);
  }
}

TEST_CASE("CUDA IPC offer checks name the field and the value",
          "[weights][cuda_ipc]") {
  const v1::WeightManifest manifest = ManifestOfSize(7, 4096);
  CudaIpcLocalView local{LocalBootId(), {"GPU-other", kDevice}};
  REQUIRE_FALSE(local.boot_id.empty());
  auto good = ValidateCudaIpcOffer(GoodOffer(4096), manifest, local);
  REQUIRE(good.ok());
  CHECK(*good == 1);  // the offer's device is the second one seen here

  struct Case {
    const char* what;
    std::function<void(v1::CudaIpcOffer&)> mangle;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"short handle", [](auto& o) { o.set_handle(std::string(12, 'h')); },
       "cuda_ipc.handle has 12 bytes, expected 64"},
      {"long handle", [](auto& o) { o.set_handle(std::string(65, 'h')); },
       "cuda_ipc.handle has 65 bytes, expected 64"},
      {"no token", [](auto& o) { o.clear_token(); },
       "cuda_ipc.token has 0 bytes, expected 16"},
      {"size", [](auto& o) { o.set_size(4095); },
       "cuda_ipc.size 4095 does not match weights v7's total_bytes 4096"},
      {"offset", [](auto& o) { o.set_offset(~uint64_t{0} - 8); },
       "cuda_ipc.offset 18446744073709551607 + size 4096 overflows"},
      {"boot id", [](auto& o) { o.set_boot_id("b0b"); },
       "cuda_ipc.boot_id 'b0b' is not this host's"},
      {"device", [](auto& o) { o.set_device_uuid("GPU-unknown"); },
       "cuda_ipc.device_uuid 'GPU-unknown' is not a device this process "
       "sees (GPU-other, GPU-00000000"},
      {"no device", [](auto& o) { o.clear_device_uuid(); },
       "cuda_ipc.device_uuid '' is not a device"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    v1::CudaIpcOffer offer = GoodOffer(4096);
    c.mangle(offer);
    auto checked = ValidateCudaIpcOffer(offer, manifest, local);
    REQUIRE_FALSE(checked.ok());
    CHECK(absl::IsInvalidArgument(checked.status()));
    CHECK_THAT(std::string(checked.status().message()),
               Catch::Contains(c.message));
  }
  // A client that cannot read its boot id accepts nothing.
  local.boot_id.clear();
  CHECK_FALSE(ValidateCudaIpcOffer(GoodOffer(4096), manifest, local).ok());
}

TEST_CASE(
    "CUDA IPC pull: a malformed or unopenable offer is refused and the same "
    "version is streamed bit for bit",
    "[weights][pull][cuda_ipc]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(16);
  HostAllocations allocations;  // outlives the ring's deferred frees
  DeviceVersionRing ring(2);
  testing::WeightServerLoopback server(&store, {.cuda_ipc = &ring});
  Trainer trainer(layout, &store, &ring, &allocations);
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  HostIpcSink sink(&allocations);
  GrpcPullReceiver receiver(server.channel(), {.cuda_ipc = &sink});

  struct Case {
    const char* what;
    std::function<void(v1::CudaIpcOffer&)> mangle;
    bool refused;  // by the checks (else by the sink: cannot open)
  };
  const std::vector<Case> cases = {
      {"handle of 12 bytes",
       [](auto& o) { o.set_handle(o.handle().substr(0, 12)); }, true},
      {"size not the manifest's", [](auto& o) { o.set_size(o.size() + 64); },
       true},
      {"unknown device", [](auto& o) { o.set_device_uuid("GPU-unknown"); },
       true},
      {"another allocation's token",
       [](auto& o) { o.set_token(std::string(kCudaIpcTokenBytes, 'x')); },
       false},
      {"a handle that opens nothing here",
       [](auto& o) { o.set_handle(std::string(kCudaIpcHandleBytes, 'z')); },
       false},
  };
  uint64_t v = 0;
  for (const Case& c : cases) {
    INFO(c.what);
    const PullStats before = receiver.stats();
    const uint64_t streamed = server.service().stats().bytes;
    trainer.Publish(++v, c.mangle);
    ReceiveAndCommit(receiver, **staging, v);
    CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
    const PullStats after = receiver.stats();
    CHECK(after.cuda_ipc_versions == before.cuda_ipc_versions);
    CHECK(after.cuda_ipc_refused - before.cuda_ipc_refused ==
          (c.refused ? 1u : 0u));
    CHECK(after.cuda_ipc_open_failures - before.cuda_ipc_open_failures ==
          (c.refused ? 0u : 1u));
    CHECK(server.service().stats().bytes - streamed == layout.total_bytes());
  }
  // The next good offer is used again.
  trainer.Publish(++v);
  ReceiveAndCommit(receiver, **staging, v);
  CHECK(SameBytes((*staging)->live().bytes, trainer.current()));
  CHECK(receiver.stats().cuda_ipc_versions == 1);
  CHECK(LeasesAfterSettling(server.service(), 0) == 0);
}

TEST_CASE(
    "CUDA IPC lease: an offered buffer outlives its eviction from the ring "
    "until the client ends the call",
    "[weights][pull][cuda_ipc]") {
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(16);
  HostAllocations allocations;  // outlives the ring's deferred frees
  DeviceVersionRing ring(1);
  testing::WeightServerLoopback server(&store, {.cuda_ipc = &ring});
  Trainer trainer(layout, &store, &ring, &allocations);
  trainer.Publish(1);
  std::weak_ptr<const void> v1_memory;
  {
    auto held = ring.Offer(1, HostIpcSink(&allocations).peer());
    REQUIRE(held.ok());
    v1_memory = (*held)->memory;
  }
  HostIpcSink sink(&allocations);
  auto stub = v1::WeightServer::NewStub(server.channel());

  SECTION("a raw client: the lease lasts until it cancels") {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    v1::FetchWeightsRequest request;
    request.set_policy_version(1);
    *request.mutable_cuda_ipc() = sink.peer();
    auto reader = stub->FetchWeights(&context, request);
    v1::WeightChunk chunk;
    REQUIRE(reader->Read(&chunk));
    REQUIRE(chunk.has_cuda_ipc());
    CHECK(chunk.data().empty());
    CHECK(chunk.cuda_ipc().size() == layout.total_bytes());
    // Two newer versions push v1 out of the ring (capacity 1).
    trainer.Publish(2);
    trainer.Publish(3);
    CHECK(ring.versions() == std::vector<uint64_t>{3});
    CHECK(server.service().stats().cuda_ipc_leases == 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(v1_memory.expired());
    REQUIRE(allocations.Find(chunk.cuda_ipc().handle()) != nullptr);
    context.TryCancel();
    CHECK(reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
    CHECK(ExpiresWithin10s(v1_memory));
    CHECK(LeasesAfterSettling(server.service(), 0) == 0);
    // Released on a gRPC thread, v1 is freed by the trainer's next Put
    // (cudaFree waits for the device: never on a reactor's thread).
    const int freed = allocations.freed;
    CHECK(ring.deferred_frees()->pending() == 1);
    trainer.Publish(4);  // evicts v3 (no lease): freed with v1
    CHECK(ring.deferred_frees()->pending() == 0);
    CHECK(allocations.freed == freed + 2);
  }
  SECTION("the receiver: evicted while it copies, still copied whole") {
    auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
    REQUIRE(staging.ok());
    GrpcPullReceiver receiver(server.channel(), {.cuda_ipc = &sink});
    const Bytes v1_bytes(trainer.current().data(),
                         trainer.current().data() + trainer.current().size());
    bool leased_during_copy = false;
    sink.during_copy = [&] {
      trainer.Publish(2);
      leased_during_copy =
          !v1_memory.expired() && server.service().stats().cuda_ipc_leases == 1;
    };
    auto manifest = store.Manifest(1);
    REQUIRE(manifest.ok());
    REQUIRE(receiver.Fetch(staging->get(), *manifest, Soon()).ok());
    REQUIRE((*staging)->Commit().ok());
    CHECK(leased_during_copy);
    const auto live = (*staging)->live().bytes;
    CHECK(Bytes(live.begin(), live.end()) == v1_bytes);
    CHECK(receiver.stats().cuda_ipc_versions == 1);
    CHECK(ExpiresWithin10s(v1_memory));
  }
  SECTION("Shutdown ends a call holding a lease") {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    v1::FetchWeightsRequest request;
    *request.mutable_cuda_ipc() = sink.peer();
    auto reader = stub->FetchWeights(&context, request);
    v1::WeightChunk chunk;
    REQUIRE(reader->Read(&chunk));
    REQUIRE(chunk.has_cuda_ipc());
    server.service().Shutdown();
    CHECK_FALSE(reader->Read(&chunk));
    CHECK(reader->Finish().error_code() == grpc::StatusCode::UNAVAILABLE);
    trainer.Publish(2);  // evicts v1 from the ring
    CHECK(ExpiresWithin10s(v1_memory));
  }
}

TEST_CASE(
    "CUDA IPC ring: keeps the newest versions, replaces a republished one "
    "and offers only to clients on this host",
    "[weights][cuda_ipc]") {
  HostAllocations allocations;
  DeviceVersionRing ring(2);
  const Bytes bytes(256, 7);
  std::vector<std::weak_ptr<const void>> memory;
  for (uint64_t v : {3, 1, 2, 4}) {  // out of order: kept by version
    auto buffer = allocations.Allocate(v, bytes);
    memory.push_back(buffer->memory);
    ring.Put(buffer);
  }
  CHECK(ring.versions() == std::vector<uint64_t>{3, 4});
  // v1 and v2 were dropped and are freed (no lease holds them).
  CHECK(memory[1].expired());
  CHECK(memory[2].expired());
  CHECK_FALSE(memory[0].expired());
  v1::CudaIpcPeer here;
  here.set_boot_id(LocalBootId());
  {
    auto held = ring.Offer(4, here);
    REQUIRE(held.ok());
    CHECK((*held)->policy_version == 4);
  }
  // Version 0 is a version like any other, not "the newest".
  CHECK(absl::IsNotFound(ring.Offer(0, here).status()));
  CHECK(absl::IsNotFound(ring.Offer(2, here).status()));
  v1::CudaIpcPeer elsewhere;
  elsewhere.set_boot_id("another-boot");
  auto refused = ring.Offer(4, elsewhere);
  CHECK(absl::IsFailedPrecondition(refused.status()));
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("another-boot"));
  CHECK(absl::IsFailedPrecondition(ring.Offer(4, {}).status()));
  // Republishing v4 replaces its buffer.
  auto again = allocations.Allocate(4, bytes);
  ring.Put(again);
  CHECK(ring.versions() == std::vector<uint64_t>{3, 4});
  CHECK(ring.Offer(4, here).value()->offer.token() == again->offer.token());
  CHECK(memory[3].expired());
}

TEST_CASE(
    "CUDA IPC ring: lends the buffer the next Put evicts for reuse only when "
    "the ring is full, the size matches and no lease holds it",
    "[weights][cuda_ipc]") {
  HostAllocations allocations;
  DeviceVersionRing ring(2);
  const Bytes bytes(256, 7);
  v1::CudaIpcPeer here;
  here.set_boot_id(LocalBootId());
  ring.Put(allocations.Allocate(1, bytes));
  // Not full: the next Put evicts nothing, so nothing is lent.
  CHECK(ring.TakeOldestForReuse(bytes.size()) == nullptr);
  ring.Put(allocations.Allocate(2, bytes));
  // Another size (a new layout) is not lent.
  CHECK(ring.TakeOldestForReuse(bytes.size() + 64) == nullptr);
  {
    // A lease on v1 (a client copying it) keeps it offered, not lent.
    auto lease = ring.Offer(1, here);
    REQUIRE(lease.ok());
    CHECK(ring.TakeOldestForReuse(bytes.size()) == nullptr);
  }
  CHECK(ring.versions() == std::vector<uint64_t>{1, 2});
  auto lent = ring.TakeOldestForReuse(bytes.size());
  REQUIRE(lent != nullptr);
  CHECK(lent->policy_version == 1);
  CHECK(lent.use_count() == 1);  // the caller's alone
  // Out of the ring: no longer offered, and no lease can begin.
  CHECK(ring.versions() == std::vector<uint64_t>{2});
  CHECK(absl::IsNotFound(ring.Offer(1, here).status()));
  const int freed = allocations.freed;
  lent.reset();
  ring.Put(allocations.Allocate(3, bytes));
  CHECK(allocations.freed == freed + 1);  // a lent buffer dropped is freed
  CHECK(ring.versions() == std::vector<uint64_t>{2, 3});
}

}  // namespace
}  // namespace tandem::weights
