// Weight transport throughput against a plain TCP socket copy of the same
// bytes in the same run (issue 5 benchmarks). Sender and receiver are
// threads of one process talking over loopback TCP.
//
//   weights_transport_bench [MiB...]   (default: 64 256)
//
// Rows: socket = raw write()/read() of the buffer; pull = gRPC catch-up
// stream into StagingWeights (1 MiB chunks, CRC per chunk and per bucket);
// gloo = c10d ProcessGroupGloo broadcast into StagingWeights, 1 receiver,
// buckets of 64 MiB, with bucket CRC verification.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/weights/gloo_broadcast_transport.h"
#include "common/weights/grpc_pull_receiver.h"
#include "common/weights/weight_server.h"
#include "common/weights/weight_store.h"

namespace tandem::weights {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "weights_transport_bench: %s\n", what.c_str());
  std::exit(1);
}

double SocketCopySeconds(const std::vector<uint8_t>& src) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Die("socket setup failed");
  }
  std::vector<uint8_t> dst(src.size());
  const auto start = Clock::now();
  std::thread reader([&] {
    int fd = accept(listener, nullptr, nullptr);
    size_t got = 0;
    while (got < dst.size()) {
      ssize_t n = read(fd, dst.data() + got, dst.size() - got);
      if (n <= 0) Die("socket read failed");
      got += static_cast<size_t>(n);
    }
    close(fd);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    Die("connect failed");
  }
  size_t sent = 0;
  while (sent < src.size()) {
    ssize_t n = write(fd, src.data() + sent,
                      std::min<size_t>(1 << 20, src.size() - sent));
    if (n <= 0) Die("socket write failed");
    sent += static_cast<size_t>(n);
  }
  reader.join();
  const double s = Since(start);
  close(fd);
  close(listener);
  if (dst != src) Die("socket copy mismatch");
  return s;
}

double PullSeconds(const FlatWeightLayout& layout,
                   const v1::WeightManifest& manifest,
                   std::shared_ptr<const std::vector<uint8_t>> payload) {
  WeightStore store(2);
  if (!store.Put(manifest, payload).ok()) Die("store put");
  WeightServerService service(&store, {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  builder.SetMaxSendMessageSize(8 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
  GrpcPullReceiver receiver(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                          grpc::InsecureChannelCredentials()),
      {});
  const auto start = Clock::now();
  auto got =
      receiver.ReceiveNext(staging->get(), absl::Now() + absl::Seconds(600));
  const double s = Since(start);
  if (!got.ok()) Die(got.status().ToString());
  server->Shutdown();
  return s;
}

double GlooSeconds(const FlatWeightLayout& layout,
                   const v1::WeightManifest& manifest,
                   const std::vector<uint8_t>& payload) {
  auto store = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(60));
  if (!store.ok()) Die(store.status().ToString());
  const uint16_t port = (*store)->port();
  auto config = [&](int rank) {
    GlooGroupConfig c;
    c.store_port = port;
    c.rank = rank;
    c.world_size = 2;
    c.key_prefix = "bench";
    c.timeout = absl::Seconds(120);
    return c;
  };
  double seconds = 0;
  std::thread receiver_thread([&] {
    auto group = GlooBroadcastGroup::Create(config(1));
    if (!group.ok()) Die(group.status().ToString());
    auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
    GlooWeightReceiver receiver(group->get());
    // Warm-up version 0 establishes the pairs; version 1 is timed.
    for (int v = 0; v < 2; ++v) {
      const auto start = Clock::now();
      auto got = receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
      if (!got.ok()) Die(got.status().ToString());
      if (!(*staging)->Commit().ok()) Die("commit");
      seconds = Since(start);
    }
  });
  auto group = GlooBroadcastGroup::Create(config(0), store->get());
  if (!group.ok()) Die(group.status().ToString());
  GlooWeightSender sender(group->get());
  for (uint64_t v = 0; v < 2; ++v) {
    v1::WeightManifest m = manifest;
    m.set_policy_version(v);
    if (!sender.Publish(m, payload, absl::InfiniteFuture()).ok()) {
      Die("publish");
    }
  }
  receiver_thread.join();
  return seconds;
}

void Run(uint64_t mib) {
  const uint64_t bytes = mib << 20;
  auto layout = FlatWeightLayout::Create(
      {{"w", v1::DTYPE_BF16, {static_cast<int64_t>(bytes / 2)}, bytes}},
      {.bucket_bytes = 64 << 20, .alignment = 64});
  if (!layout.ok()) Die(layout.status().ToString());
  auto payload = std::make_shared<std::vector<uint8_t>>(bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t r = rng();
    std::memcpy(payload->data() + i, &r, 8);
  }
  auto manifest = layout->BuildManifest(*payload, 1);
  if (!manifest.ok()) Die(manifest.status().ToString());
  const double socket_s = SocketCopySeconds(*payload);
  const double pull_s = PullSeconds(*layout, *manifest, payload);
  const double gloo_s = GlooSeconds(*layout, *manifest, *payload);
  auto gbps = [&](double s) { return bytes / s / 1e9; };
  absl::PrintF("| %d MiB | %.2f | %.2f (%.2fx) | %.2f (%.2fx) |\n", mib,
               gbps(socket_s), gbps(pull_s), socket_s / pull_s, gbps(gloo_s),
               socket_s / gloo_s);
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) {
  std::vector<uint64_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], 0, 10));
  if (sizes.empty()) sizes = {64, 256};
  absl::PrintF(
      "| size | socket GB/s | pull GB/s (ratio) | gloo 1 receiver GB/s "
      "(ratio) |\n|---|---|---|---|\n");
  for (uint64_t mib : sizes) tandem::weights::Run(mib);
  return 0;
}
