// The raw data path's sealed stream (weight_server.h, "Raw data path
// confidentiality"): a real WeightServerService on a loopback port. With a
// data-plane key, what crosses the socket after the proof (read here by a
// plain-socket client that holds the key) carries none of the version's
// bytes, yet opens record by record into the plaintext stream; without a
// key the same version crosses in the clear. A GrpcPullReceiver with the
// key commits the version bit-exact over the raw path; a record whose
// ciphertext was altered on the way is refused (counted) and the version
// still arrives bit-exact, over FetchWeights.

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/weights/data_plane_seal.h"
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

using testing::ConnectLoopback;
using testing::HolderOf;
using testing::RawRequestBytes;
using testing::ReadN;
using testing::TestKey;

// The float32 1.2345678f, little-endian: every tensor byte of the version
// is this pattern, so any 16 bytes of the plaintext on the wire show it.
constexpr uint8_t kPattern[4] = {0x52, 0x06, 0x9E, 0x3F};

struct PatternServer {
  explicit PatternServer(std::shared_ptr<const DataPlaneKeyHolder> holder)
      : layout(testing::SmallLayout()),
        weights(layout.total_bytes()),
        store(4),
        server(&store, {.data_plane_key = std::move(holder)}) {
    for (const TensorPlacement& t : layout.tensors()) {
      for (uint64_t i = 0; i < t.info.byte_size; ++i) {
        weights.data()[t.offset + i] = kPattern[i % 4];
      }
    }
    REQUIRE(testing::PutFullVersion(store, layout, weights, 1).ok());
  }
  uint16_t data_port() { return server.service().data_port(); }

  FlatWeightLayout layout;
  WeightBuffer weights;
  WeightStore store;
  testing::WeightServerLoopback server;
};

bool HasPattern(const std::string& bytes) {
  std::string needle;
  for (int i = 0; i < 4; ++i) {
    needle.append(reinterpret_cast<const char*>(kPattern), 4);
  }
  return bytes.find(needle) != std::string::npos;
}

// What crossed the socket from the server for one raw request of version 1
// (after the proof, with `key`), and the challenge's nonce.
struct Capture {
  std::string wire;
  std::string challenge;
};

Capture CaptureStream(uint16_t port, const std::optional<DataPlaneKey>& key) {
  const int fd = ConnectLoopback(port);
  Capture c;
  std::string out;
  if (key.has_value()) {
    c.challenge = ReadN(fd, kRawChallengeBytes);
    REQUIRE(c.challenge.size() == kRawChallengeBytes);
    auto proof = ProveRawChallenge(
        absl::MakeConstSpan(
            reinterpret_cast<const uint8_t*>(c.challenge.data()),
            c.challenge.size()),
        *key);
    REQUIRE(proof.ok());
    out.assign(reinterpret_cast<const char*>(proof->data()), proof->size());
  }
  out += RawRequestBytes();
  REQUIRE(send(fd, out.data(), out.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(out.size()));
  c.wire = ReadN(fd, 0);
  close(fd);
  return c;
}

// Opens the sealed records of `c` in order; the plaintext stream, or the
// first refusal.
absl::StatusOr<std::string> OpenRecords(const Capture& c,
                                        const DataPlaneKey& key) {
  auto seal = WeightSeal::Derive(
      key,
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(c.challenge.data()),
                          c.challenge.size())
          .subspan(12),
      kSealPurposeRaw);
  if (!seal.ok()) return seal.status();
  std::string plain;
  size_t at = 0;
  for (uint64_t index = 0; at < c.wire.size(); ++index) {
    uint32_t length = 0;
    if (c.wire.size() - at < 4) return absl::DataLossError("cut record");
    std::memcpy(&length, c.wire.data() + at, 4);
    if (c.wire.size() - at < 4 + length + kSealTagBytes) {
      return absl::DataLossError("cut record");
    }
    const auto* cipher =
        reinterpret_cast<const uint8_t*>(c.wire.data() + at + 4);
    SealTag tag;
    std::memcpy(tag.data(), cipher + length, tag.size());
    std::string piece(length, '\0');
    if (absl::Status s = seal->Open(
            index, {reinterpret_cast<const uint8_t*>(&length), 4},
            {cipher, length}, tag, reinterpret_cast<uint8_t*>(piece.data()),
            "capture");
        !s.ok()) {
      return s;
    }
    plain += piece;
    at += 4 + length + kSealTagBytes;
  }
  return plain;
}

TEST_CASE("a sealed raw stream carries no plaintext weights on the wire") {
  const DataPlaneKey key = TestKey(5);
  PatternServer s(HolderOf(key));
  REQUIRE(s.data_port() != 0);
  const Capture c = CaptureStream(s.data_port(), key);
  REQUIRE(c.wire.size() > s.weights.size());
  CHECK_FALSE(HasPattern(c.wire));
  // It is the stream, sealed: opened record by record it holds the
  // status, the chunks and the version's bytes.
  absl::StatusOr<std::string> plain = OpenRecords(c, key);
  INFO(plain.status().ToString());
  REQUIRE(plain.ok());
  uint32_t status[3];
  REQUIRE(plain->size() > sizeof(status));
  std::memcpy(status, plain->data(), sizeof(status));
  CHECK(status[0] == kRawMagic);
  CHECK(status[1] == 0);
  CHECK(HasPattern(*plain));
  // Another secret (a stranger's, or another epoch's) does not open it.
  CHECK(absl::IsDataLoss(OpenRecords(c, TestKey(5)).status()));
}

TEST_CASE("without a data-plane key the raw stream is plaintext") {
  // tls.mode off: no secret, no seal; the capture sees the weights (the
  // check above could fail).
  PatternServer s(nullptr);
  const Capture c = CaptureStream(s.data_port(), std::nullopt);
  CHECK(HasPattern(c.wire));
}

TEST_CASE("a receiver with the key commits a sealed raw version bit-exact") {
  const DataPlaneKey key = TestKey(5);
  PatternServer s(HolderOf(key));
  auto staging = StagingWeights::Create(s.layout, StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  GrpcPullReceiver receiver(
      s.server.channel(),
      {.shared_memory = false, .data_plane_key = HolderOf(key)});

  SECTION("untouched") {
    auto got = receiver.ReceiveNext(staging->get(),
                                    absl::Now() + absl::Seconds(20));
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    CHECK(receiver.stats().raw_streams >= 1);
    CHECK(receiver.stats().grpc_streams == 0);
    CHECK(receiver.stats().raw_decrypt_failures == 0);
  }
  SECTION("a record altered on the wire is refused, the version pulled") {
    // Record 0 is the status; record 1 carries chunks.
    s.server.service().CorruptSealedRecordForTest(1);
    auto got = receiver.ReceiveNext(staging->get(),
                                    absl::Now() + absl::Seconds(20));
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    CHECK(receiver.stats().raw_decrypt_failures == 1);
    CHECK(receiver.stats().grpc_streams >= 1);
  }
  REQUIRE((*staging)->Commit().ok());
  const auto live = (*staging)->live().bytes;
  REQUIRE(live.size() == s.weights.size());
  CHECK(std::memcmp(live.data(), s.weights.data(), live.size()) == 0);
}

}  // namespace
}  // namespace tandem::weights
