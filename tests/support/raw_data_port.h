// The trainer's raw weight data port in tests: data-plane keys made for a
// test, a real weight server holding one random version behind a key, a
// pull of it checked bit for bit, and a plain-socket client for tests that
// play a client the receiver would never be (one without the secret, one
// that records what crossed): connecting on loopback, reading, the raw
// request's bytes.
#ifndef TANDEM_TESTS_SUPPORT_RAW_DATA_PORT_H_
#define TANDEM_TESTS_SUPPORT_RAW_DATA_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/weights/pull/data_plane_auth.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/staging_weights.h"
#include "common/weights/weight_store.h"
#include "tests/unit/weight_server_test_util.h"
#include "tests/unit/weights_test_util.h"

namespace tandem::weights::testing {

// A fresh random key for `epoch`.
inline DataPlaneKey TestKey(uint64_t epoch) {
  auto key = NewDataPlaneKey(epoch);
  REQUIRE(key.ok());
  return *key;
}

// A holder whose current key is `key` (no previous one).
inline std::shared_ptr<DataPlaneKeyHolder> HolderOf(const DataPlaneKey& key) {
  auto holder = std::make_shared<DataPlaneKeyHolder>();
  holder->Set(key);
  return holder;
}

// One random FULL version 1 (SmallLayout) in a store, served by a real
// weight server on loopback whose raw port holds `holder` (null: no key,
// tls.mode off).
struct KeyedVersionServer {
  explicit KeyedVersionServer(std::shared_ptr<const DataPlaneKeyHolder> holder)
      : layout(SmallLayout()),
        weights(layout.total_bytes()),
        store(4),
        server(&store, {.data_plane_key = std::move(holder)}) {
    std::mt19937_64 rng(5);
    FillRandom(layout, &weights, rng);
    REQUIRE(PutFullVersion(store, layout, weights, 1).ok());
  }
  uint16_t data_port() { return server.service().data_port(); }

  // Pulls version 1 with `options`; REQUIREs it arrived bit for bit. The
  // receiver's stats.
  PullStats Pull(PullOptions options) {
    auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
    REQUIRE(staging.ok());
    GrpcPullReceiver receiver(server.channel(), std::move(options));
    auto got =
        receiver.ReceiveNext(staging->get(), absl::Now() + absl::Seconds(20));
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    REQUIRE(*got == 1);
    REQUIRE((*staging)->Commit().ok());
    const auto live = (*staging)->live().bytes;
    REQUIRE(live.size() == weights.size());
    REQUIRE(std::memcmp(live.data(), weights.data(), live.size()) == 0);
    return receiver.stats();
  }

  FlatWeightLayout layout;
  WeightBuffer weights;
  WeightStore store;
  WeightServerLoopback server;
};

// A TCP connection to 127.0.0.1:`port`.
inline int ConnectLoopback(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

// Reads `n` bytes, or with `n` 0 everything until the peer closes, within
// `within`; what arrived (shorter when the peer closed or time ran out).
inline std::string ReadN(int fd, size_t n,
                         absl::Duration within = absl::Seconds(10)) {
  std::string out;
  const absl::Time until = absl::Now() + within;
  while ((n == 0 || out.size() < n) && absl::Now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[65536];
    const size_t want =
        n == 0 ? sizeof(buf) : std::min(sizeof(buf), n - out.size());
    const ssize_t got = recv(fd, buf, want, 0);
    if (got <= 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  return out;
}

// The raw request for `version` (u32 kRawMagic, u32 length, the
// serialized FetchWeightsRequest), as a client without a secret sends it
// first and one with a secret sends it after its proof.
inline std::string RawRequestBytes(uint64_t version = 1) {
  v1::FetchWeightsRequest request;
  request.set_policy_version(version);
  const std::string body = request.SerializeAsString();
  std::string out(8, '\0');
  const uint32_t head[2] = {kRawMagic, static_cast<uint32_t>(body.size())};
  std::memcpy(out.data(), head, sizeof(head));
  return out + body;
}

}  // namespace tandem::weights::testing

#endif  // TANDEM_TESTS_SUPPORT_RAW_DATA_PORT_H_
