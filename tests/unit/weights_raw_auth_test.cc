// The raw data path with a data-plane key (weight_server.h, "Raw data path
// authentication"): a real WeightServerService on a loopback port and a
// GrpcPullReceiver, or a plain socket playing a client without the
// secret. A receiver with the epoch's key pulls over the raw socket; a
// connection without a proof, with a stale epoch's, with garbage or with
// a truncated one is refused at once, counted; a receiver with a stale
// key still gets every byte, over FetchWeights.

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/weights/pull/data_plane_auth.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/staging_weights.h"
#include "common/weights/weight_store.h"
#include "tests/support/raw_data_port.h"
#include "weight_server_test_util.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using AuthServer = testing::KeyedVersionServer;
using testing::ConnectLoopback;
using testing::HolderOf;
using testing::RawRequestBytes;
using testing::ReadN;
using testing::TestKey;

// What the server answered a client that sent `first` after the
// challenge: the raw status code and message (code -1: nothing), and how
// long the refusal took.
struct Answer {
  int code = -1;
  std::string message;
  double seconds = 0;
  bool closed = false;
};

Answer SendAfterChallenge(uint16_t port, const std::string& first,
                          bool half_close = false) {
  const int fd = ConnectLoopback(port);
  const std::string challenge = ReadN(fd, kRawChallengeBytes);
  REQUIRE(challenge.size() == kRawChallengeBytes);
  const auto start = std::chrono::steady_clock::now();
  if (!first.empty()) {
    REQUIRE(send(fd, first.data(), first.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(first.size()));
  }
  if (half_close) shutdown(fd, SHUT_WR);
  Answer answer;
  const std::string head = ReadN(fd, 12);
  if (head.size() == 12) {
    uint32_t h[3];
    std::memcpy(h, head.data(), sizeof(h));
    if (h[0] == kRawMagic) {
      answer.code = static_cast<int>(h[1]);
      answer.message = ReadN(fd, h[2]);
    }
  }
  answer.closed = ReadN(fd, 1).empty();
  answer.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  close(fd);
  return answer;
}

constexpr int kUnauthenticated =
    static_cast<int>(absl::StatusCode::kUnauthenticated);

TEST_CASE("a receiver with the epoch's key pulls over the raw path") {
  const DataPlaneKey key = TestKey(3);
  AuthServer s(HolderOf(key));
  REQUIRE(s.data_port() != 0);
  const PullStats stats = s.Pull({.shared_memory = false,
                                   .data_plane_key = HolderOf(key)});
  CHECK(stats.raw_streams >= 1);
  CHECK(stats.grpc_streams == 0);
  CHECK(stats.raw_auth_fallbacks == 0);
  CHECK(s.server.service().stats().data_auth_refused == 0);
}

TEST_CASE("a raw client without the secret is refused at once") {
  AuthServer s(HolderOf(TestKey(3)));
  // The request a client without a secret sends first.
  const Answer answer = SendAfterChallenge(s.data_port(), RawRequestBytes());
  CHECK(answer.code == kUnauthenticated);
  CHECK(answer.message ==
        "raw weight data: no data-plane proof (the client holds no epoch "
        "secret, or sent garbage)");
  CHECK(answer.closed);
  CHECK(answer.seconds < 2.0);  // not the 10 s request timeout
  CHECK(s.server.service().stats().data_auth_refused == 1);
  CHECK(s.server.service().stats().streams == 0);
}

TEST_CASE("a stale epoch's proof is refused at once") {
  const DataPlaneKey old_key = TestKey(2);
  AuthServer s(HolderOf(TestKey(3)));
  const int fd = ConnectLoopback(s.data_port());
  std::string challenge = ReadN(fd, kRawChallengeBytes);
  REQUIRE(challenge.size() == kRawChallengeBytes);
  std::memcpy(challenge.data() + 4, &old_key.epoch, 8);
  auto proof = ProveRawChallenge(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(challenge.data()),
                          challenge.size()),
      old_key);
  REQUIRE(proof.ok());
  const std::string out =
      std::string(reinterpret_cast<const char*>(proof->data()), proof->size()) +
      RawRequestBytes();
  REQUIRE(send(fd, out.data(), out.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(out.size()));
  const std::string head = ReadN(fd, 12);
  REQUIRE(head.size() == 12);
  uint32_t h[3];
  std::memcpy(h, head.data(), sizeof(h));
  CHECK(h[1] == static_cast<uint32_t>(kUnauthenticated));
  CHECK(ReadN(fd, h[2]) ==
        "raw weight data: proof for data-plane epoch 2, the current epoch is "
        "3 (stale secret)");
  close(fd);
  CHECK(s.server.service().stats().data_auth_refused == 1);
  CHECK(s.server.service().stats().streams == 0);
}

TEST_CASE("garbage and truncated proofs are refused at once") {
  AuthServer s(HolderOf(TestKey(3)));
  std::mt19937_64 rng(3);
  std::string garbage(kRawProofBytes, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  garbage[0] = 'X';
  Answer answer = SendAfterChallenge(s.data_port(), garbage);
  CHECK(answer.code == kUnauthenticated);
  CHECK(answer.seconds < 2.0);
  // The right magic and epoch, a random MAC.
  std::string forged(kRawProofBytes, '\0');
  const uint32_t magic = kRawAuthMagic;
  const uint64_t epoch = 3;
  std::memcpy(forged.data(), &magic, 4);
  std::memcpy(forged.data() + 4, &epoch, 8);
  for (size_t i = 12; i < forged.size(); ++i) {
    forged[i] = static_cast<char>(rng());
  }
  answer = SendAfterChallenge(s.data_port(), forged);
  CHECK(answer.code == kUnauthenticated);
  CHECK(answer.message ==
        "raw weight data: wrong data-plane proof for epoch 3");
  // Half a proof, then the client closes its side.
  answer = SendAfterChallenge(s.data_port(), forged.substr(0, 20),
                              /*half_close=*/true);
  CHECK(answer.code == kUnauthenticated);
  CHECK(answer.message ==
        "raw weight data: truncated data-plane proof (20 of 44 bytes)");
  CHECK(answer.seconds < 2.0);
  CHECK(s.server.service().stats().data_auth_refused == 3);
  CHECK(s.server.service().stats().streams == 0);
}

TEST_CASE("a receiver with a stale key still pulls, over FetchWeights") {
  AuthServer s(HolderOf(TestKey(4)));
  const PullStats stats = s.Pull({.shared_memory = false,
                                   .data_plane_key = HolderOf(TestKey(3))});
  CHECK(stats.raw_auth_fallbacks >= 1);
  CHECK(stats.raw_streams == 0);
  CHECK(stats.grpc_streams >= 1);
  CHECK(s.server.service().stats().data_auth_refused >= 1);
}

TEST_CASE("before the first epoch every raw connection is refused") {
  AuthServer s(std::make_shared<DataPlaneKeyHolder>());
  const int fd = ConnectLoopback(s.data_port());
  const std::string head = ReadN(fd, 12);
  REQUIRE(head.size() == 12);
  uint32_t h[3];
  std::memcpy(h, head.data(), sizeof(h));
  CHECK(h[0] == kRawMagic);
  CHECK(h[1] == static_cast<uint32_t>(absl::StatusCode::kUnavailable));
  close(fd);
  CHECK(s.server.service().stats().data_auth_refused == 1);
  // A receiver (holding a key, or not yet) gets its bytes over gRPC.
  const PullStats stats = s.Pull({.shared_memory = false,
                                   .data_plane_key = HolderOf(TestKey(1))});
  CHECK(stats.grpc_streams >= 1);
  CHECK(stats.raw_streams == 0);
}

}  // namespace
}  // namespace tandem::weights
