// The raw weight data path's per-epoch challenge-response
// (common/weights/pull/data_plane_auth.h): a proof made with the epoch's
// secret for the server's nonce is accepted; a missing, stale, garbage,
// truncated, replayed or forged one is refused UNAUTHENTICATED.

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/weights/pull/data_plane_auth.h"

namespace tandem::weights {
namespace {

DataPlaneKey Key(uint64_t epoch) {
  auto key = NewDataPlaneKey(epoch);
  REQUIRE(key.ok());
  return *key;
}

RawChallenge Challenge(uint64_t epoch) {
  auto challenge = NewRawChallenge(epoch);
  REQUIRE(challenge.ok());
  return *challenge;
}

absl::Status Verify(const std::vector<uint8_t>& proof,
                    const RawChallenge& challenge, const DataPlaneKey& key) {
  return VerifyRawProof(proof, challenge, key);
}

std::vector<uint8_t> Bytes(const RawProof& proof) {
  return {proof.begin(), proof.end()};
}

TEST_CASE("a proof made with the epoch's secret is accepted") {
  const DataPlaneKey key = Key(7);
  const RawChallenge challenge = Challenge(7);
  auto proof = ProveRawChallenge(challenge, key);
  REQUIRE(proof.ok());
  CHECK(Verify(Bytes(*proof), challenge, key).ok());
  // The secret is not in what crosses the socket.
  const std::string wire(reinterpret_cast<const char*>(proof->data()),
                         proof->size());
  const std::string secret(reinterpret_cast<const char*>(key.secret.data()),
                           key.secret.size());
  CHECK(wire.find(secret) == std::string::npos);
}

TEST_CASE("a key from the coordinator's bytes proves like the original") {
  const DataPlaneKey key = Key(3);
  auto copy = DataPlaneKeyFromBytes(3, key.secret);
  REQUIRE(copy.ok());
  const RawChallenge challenge = Challenge(3);
  auto proof = ProveRawChallenge(challenge, *copy);
  REQUIRE(proof.ok());
  CHECK(Verify(Bytes(*proof), challenge, key).ok());
  const std::vector<uint8_t> short_secret(16, 1);
  CHECK(DataPlaneKeyFromBytes(3, short_secret).status().message() ==
        "data-plane secret of epoch 3 has 16 bytes, expected 32");
}

TEST_CASE("a stale epoch's secret is refused") {
  const DataPlaneKey old_key = Key(4);
  const DataPlaneKey key = Key(5);
  const RawChallenge challenge = Challenge(5);
  // The client sees the epoch differs and does not even try.
  auto refused = ProveRawChallenge(challenge, old_key);
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.status().message() ==
        "raw weight data: the server is at data-plane epoch 5, this process "
        "holds the secret of epoch 4");
  // A client that answers anyway with its old epoch...
  const RawChallenge old_challenge = Challenge(4);
  auto old_proof = ProveRawChallenge(old_challenge, old_key);
  REQUIRE(old_proof.ok());
  absl::Status s = Verify(Bytes(*old_proof), challenge, key);
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  CHECK(s.message() ==
        "raw weight data: proof for data-plane epoch 4, the current epoch is "
        "5 (stale secret)");
  // ...or claims the current epoch with the old secret.
  DataPlaneKey relabelled = old_key;
  relabelled.epoch = 5;
  auto forged = ProveRawChallenge(challenge, relabelled);
  REQUIRE(forged.ok());
  s = Verify(Bytes(*forged), challenge, key);
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  CHECK(s.message() == "raw weight data: wrong data-plane proof for epoch 5");
}

TEST_CASE("a client without the secret is refused") {
  const DataPlaneKey key = Key(1);
  const RawChallenge challenge = Challenge(1);
  // What a client without a secret sends first: its request's header
  // (kRawMagic "TWD1", length) and the request.
  std::vector<uint8_t> request(kRawProofBytes, 0);
  const uint32_t head[2] = {0x31445754, 12};
  std::memcpy(request.data(), head, sizeof(head));
  absl::Status s = Verify(request, challenge, key);
  CHECK(s.code() == absl::StatusCode::kUnauthenticated);
  CHECK(s.message() ==
        "raw weight data: no data-plane proof (the client holds no epoch "
        "secret, or sent garbage)");
}

TEST_CASE("garbage is refused") {
  const DataPlaneKey key = Key(2);
  const RawChallenge challenge = Challenge(2);
  std::mt19937_64 rng(11);
  for (int i = 0; i < 100; ++i) {
    std::vector<uint8_t> garbage(kRawProofBytes);
    for (uint8_t& b : garbage) b = static_cast<uint8_t>(rng());
    CHECK(Verify(garbage, challenge, key).code() ==
          absl::StatusCode::kUnauthenticated);
  }
  // The right header with a random MAC.
  auto proof = ProveRawChallenge(challenge, key);
  REQUIRE(proof.ok());
  std::vector<uint8_t> forged = Bytes(*proof);
  for (size_t i = 12; i < forged.size(); ++i) {
    forged[i] = static_cast<uint8_t>(rng());
  }
  CHECK(Verify(forged, challenge, key).message() ==
        "raw weight data: wrong data-plane proof for epoch 2");
  // One flipped bit anywhere in the MAC.
  for (size_t bit = 12 * 8; bit < kRawProofBytes * 8; bit += 7) {
    std::vector<uint8_t> flipped = Bytes(*proof);
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    CHECK(Verify(flipped, challenge, key).code() ==
          absl::StatusCode::kUnauthenticated);
  }
  // And a challenge that is not one, on the client's side.
  std::vector<uint8_t> not_challenge(kRawChallengeBytes, 0x41);
  CHECK(ProveRawChallenge(not_challenge, key).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a truncated proof is refused") {
  const DataPlaneKey key = Key(9);
  const RawChallenge challenge = Challenge(9);
  auto proof = ProveRawChallenge(challenge, key);
  REQUIRE(proof.ok());
  for (size_t n : {size_t{0}, size_t{3}, size_t{4}, size_t{12},
                   kRawProofBytes - 1}) {
    INFO("bytes " << n);
    std::vector<uint8_t> cut(proof->begin(), proof->begin() + n);
    CHECK(Verify(cut, challenge, key).code() ==
          absl::StatusCode::kUnauthenticated);
  }
  std::vector<uint8_t> cut(proof->begin(), proof->begin() + 20);
  CHECK(Verify(cut, challenge, key).message() ==
        "raw weight data: truncated data-plane proof (20 of 44 bytes)");
  // A truncated challenge, on the client's side.
  CHECK(ProveRawChallenge(absl::MakeSpan(challenge.data(), 20), key)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a proof is good for its own nonce only (no replay)") {
  const DataPlaneKey key = Key(6);
  const RawChallenge first = Challenge(6);
  const RawChallenge second = Challenge(6);
  REQUIRE(first != second);
  auto proof = ProveRawChallenge(first, key);
  REQUIRE(proof.ok());
  CHECK(Verify(Bytes(*proof), first, key).ok());
  CHECK(Verify(Bytes(*proof), second, key).code() ==
        absl::StatusCode::kUnauthenticated);
}

TEST_CASE("the key holder hands out the latest key") {
  DataPlaneKeyHolder holder;
  CHECK_FALSE(holder.Get().has_value());
  holder.Set(Key(1));
  holder.Set(Key(2));
  REQUIRE(holder.Get().has_value());
  CHECK(holder.Get()->epoch == 2);
}

}  // namespace
}  // namespace tandem::weights
