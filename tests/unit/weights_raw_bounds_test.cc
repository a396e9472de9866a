// The weight server's raw data path keeps bounded resources whatever its
// clients do: idle sockets cost a slot (evicted for newcomers) and never a
// thread, requests must arrive in time, a receiver that stops reading
// loses its stream, and a legitimate receiver is still served.

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "tests/support/wait_for.h"
#include "weight_server_test_util.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

int ThreadsOfThisProcess() {
  int n = 0;
  DIR* dir = opendir("/proc/self/task");
  REQUIRE(dir != nullptr);
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

int Connect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

std::string Framed(const v1::FetchWeightsRequest& request) {
  const std::string body = request.SerializeAsString();
  std::string out(8, '\0');
  const uint32_t head[2] = {kRawMagic, static_cast<uint32_t>(body.size())};
  std::memcpy(out.data(), head, sizeof(head));
  return out + body;
}

// Blocks until the server closes `fd` (reading and dropping what it sent);
// true when it did.
bool ClosedByServer(int fd) {
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

template <typename F>
bool WaitUntil(F done) {
  return ::tandem::testing::WaitFor(done, absl::Seconds(30));
}

// One FULL version 1 of `mib` MiB of bf16 weights in 4 MiB buckets.
struct Version {
  FlatWeightLayout layout;
  WeightBuffer weights;
};
Version Store(WeightStore& store, int64_t mib) {
  const int64_t rows = mib * 256;
  auto layout = FlatWeightLayout::Create(
      {{"model.embed_tokens.weight",
        v1::DTYPE_BF16,
        {rows, 2048},
        static_cast<uint64_t>(rows * 2048 * 2)}},
      {.bucket_bytes = 4u << 20, .alignment = 64});
  REQUIRE(layout.ok());
  std::mt19937_64 rng(3);
  WeightBuffer weights(layout->total_bytes());
  testing::FillRandom(*layout, &weights, rng);
  REQUIRE(testing::PutFullVersion(store, *layout, weights, 1).ok());
  return {*std::move(layout), std::move(weights)};
}

// A real receiver pulls version 1 over the raw data path.
void PullOverRawPath(const std::shared_ptr<grpc::Channel>& channel,
                     const Version& version) {
  auto staging =
      StagingWeights::Create(version.layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  GrpcPullReceiver receiver(channel, {.shared_memory = false});
  auto got = receiver.ReceiveNext(staging->get(),
                                  absl::Now() + absl::Seconds(30));
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  REQUIRE((*staging)->Commit().ok());
  const auto live = (*staging)->live().bytes;
  CHECK(std::memcmp(live.data(), version.weights.data(), live.size()) == 0);
  CHECK(receiver.stats().raw_streams > 0);
  CHECK(receiver.stats().grpc_streams == 0);
}

TEST_CASE(
    "Hundreds of idle raw connections cost no threads and a receiver is "
    "still served over the raw path",
    "[weights][pull][bounds]") {
  WeightStore store(4);
  const Version version = Store(store, 1);
  WeightServerOptions options;
  options.max_data_connections = 16;
  options.data_stream_threads = 2;
  testing::WeightServerLoopback server(&store, options);
  const uint16_t port = server.service().data_port();
  REQUIRE(port != 0);
  const int threads_before = ThreadsOfThisProcess();

  constexpr int kIdle = 500;
  std::vector<int> idle;
  for (int i = 0; i < kIdle; ++i) idle.push_back(Connect(port));
  // Every connection was accepted (the newest 16 hold the slots; the
  // others were evicted for them).
  REQUIRE(WaitUntil([&] {
    return server.service().stats().data_evicted >= kIdle - 16;
  }));
  const WeightServerStats stats = server.service().stats();
  CHECK(stats.data_connections <= 16);
  CHECK(stats.data_over_capacity == 0);
  CHECK(stats.data_threads == 3);
  // One thread per connection would be 500 more.
  CHECK(ThreadsOfThisProcess() <= threads_before + 2);

  PullOverRawPath(server.channel(), version);
  CHECK(server.service().stats().data_connections <= 16);
  for (int fd : idle) close(fd);
}

TEST_CASE("A raw connection without a whole request is closed at its "
          "deadline",
          "[weights][pull][bounds]") {
  WeightStore store(4);
  const Version version = Store(store, 1);
  WeightServerOptions options;
  options.data_request_timeout = absl::Milliseconds(200);
  testing::WeightServerLoopback server(&store, options);
  const int fd = Connect(server.service().data_port());
  // Half a header, then nothing.
  REQUIRE(send(fd, &kRawMagic, 4, 0) == 4);
  CHECK(ClosedByServer(fd));
  close(fd);
  CHECK(server.service().stats().data_request_timeouts == 1);
  CHECK(WaitUntil([&] {
    return server.service().stats().data_connections == 0;
  }));
  PullOverRawPath(server.channel(), version);
}

TEST_CASE(
    "With every slot streaming or queued a new raw connection is closed at "
    "once, and a stalled receiver loses its stream",
    "[weights][pull][bounds]") {
  WeightStore store(4);
  // Larger than what loopback socket buffers hold, so a receiver that
  // reads nothing stalls the stream.
  const Version version = Store(store, 32);
  WeightServerOptions options;
  options.max_data_connections = 2;
  options.data_stream_threads = 1;
  // Long enough that A surely still holds its slot when C arrives on a
  // loaded machine.
  options.data_send_timeout = absl::Seconds(2);
  testing::WeightServerLoopback server(&store, options);
  const uint16_t port = server.service().data_port();
  v1::FetchWeightsRequest request;
  request.set_policy_version(1);
  const std::string framed = Framed(request);
  // A: streaming into a receiver that never reads; B: queued behind it.
  const int a = Connect(port);
  REQUIRE(send(a, framed.data(), framed.size(), 0) ==
          static_cast<ssize_t>(framed.size()));
  REQUIRE(WaitUntil([&] { return server.service().stats().streams == 1; }));
  const int b = Connect(port);
  REQUIRE(send(b, framed.data(), framed.size(), 0) ==
          static_cast<ssize_t>(framed.size()));
  REQUIRE(WaitUntil([&] {
    return server.service().stats().data_connections == 2;
  }));
  // C finds both slots taken by requests: refused at once.
  const int c = Connect(port);
  CHECK(ClosedByServer(c));
  close(c);
  const WeightServerStats at_c = server.service().stats();
  INFO("streams " << at_c.streams << ", evicted " << at_c.data_evicted
                  << ", send timeouts " << at_c.data_send_timeouts
                  << ", request timeouts " << at_c.data_request_timeouts
                  << ", open " << at_c.data_connections);
  CHECK(at_c.data_over_capacity == 1);
  // A's stream is dropped after the send timeout; B's then too.
  REQUIRE(WaitUntil([&] {
    return server.service().stats().data_send_timeouts == 2;
  }));
  close(a);
  close(b);
  PullOverRawPath(server.channel(), version);
}

TEST_CASE(
    "A pulled version holding a NaN is refused, the live weights stay, and "
    "the receiver waits for a newer version instead of fetching it again",
    "[weights][pull][finite]") {
  const bool raw = GENERATE(true, false);
  INFO("raw data path: " << raw);
  const FlatWeightLayout layout = testing::SmallLayout();
  WeightStore store(8);
  testing::WeightServerLoopback server(&store);
  std::mt19937_64 rng(5);
  WeightBuffer good(layout.total_bytes());
  testing::FillRandom(layout, &good, rng);
  REQUIRE(testing::PutFullVersion(store, layout, good, 1).ok());
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  StagingWeights& s = **staging;
  GrpcPullReceiver receiver(server.channel(),
                            {.long_poll = absl::Milliseconds(200),
                             .raw_data = raw,
                             .shared_memory = false});
  REQUIRE(receiver.ReceiveNext(&s, absl::Now() + absl::Seconds(20)).ok());
  REQUIRE(s.Commit().ok());

  // Version 2: the trainer's bytes (every CRC matches) with a NaN.
  WeightBuffer poisoned(layout.total_bytes());
  std::memcpy(poisoned.data(), good.data(), good.size());
  const TensorPlacement* t = layout.Find("model.layers.0.self_attn.q_proj.weight");
  REQUIRE(t != nullptr);
  const uint16_t nan = 0x7FC0;
  std::memcpy(poisoned.data() + t->offset + 2 * 77, &nan, 2);
  REQUIRE(testing::PutFullVersion(store, layout, poisoned, 2).ok());
  absl::StatusOr<uint64_t> got =
      receiver.ReceiveNext(&s, absl::Now() + absl::Seconds(20));
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(got.status().message()),
             Catch::Contains("weights v2 refused: tensor "
                             "'model.layers.0.self_attn.q_proj.weight' (BF16) "
                             "holds a non-finite value: element 77 is NaN"));
  CHECK(s.live().version == 1u);
  CHECK(std::memcmp(s.live().bytes.data(), good.data(), good.size()) == 0);
  CHECK(s.refused_version() == 2u);

  // Asked again, it waits for a newer version and streams nothing.
  const uint64_t streams = server.service().stats().streams;
  got = receiver.ReceiveNext(&s, absl::Now() + absl::Milliseconds(500));
  CHECK(absl::IsDeadlineExceeded(got.status()));
  CHECK(server.service().stats().streams == streams);

  // A finite version 3 goes through (in full: no delta on v2 would do).
  WeightBuffer next(layout.total_bytes());
  testing::FillRandom(layout, &next, rng);
  REQUIRE(testing::PutFullVersion(store, layout, next, 3).ok());
  got = receiver.ReceiveNext(&s, absl::Now() + absl::Seconds(20));
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  CHECK(*got == 3u);
  REQUIRE(s.Commit().ok());
  CHECK(std::memcmp(s.live().bytes.data(), next.data(), next.size()) == 0);
}

}  // namespace
}  // namespace tandem::weights
