// WeightSeal (common/weights/data_plane_seal.h): AES-256-GCM under a key
// derived from the data-plane epoch secret. A round trip is bit-exact; a
// flipped ciphertext byte, tag byte, another index (nonce), another salt,
// another purpose, other associated data or another epoch's secret is
// refused with DataLoss and leaves no plaintext behind.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "common/weights/data_plane_seal.h"

namespace tandem::weights {
namespace {

DataPlaneKey Key(uint64_t epoch) {
  auto key = NewDataPlaneKey(epoch);
  REQUIRE(key.ok());
  return *key;
}

WeightSeal Derive(const DataPlaneKey& key, const SealSalt& salt,
                  const char* purpose = kSealPurposeBroadcast) {
  auto seal = WeightSeal::Derive(key, salt, purpose);
  REQUIRE(seal.ok());
  return *seal;
}

// 256 KiB of a recognisable float32 pattern.
std::vector<uint8_t> Plain() {
  std::vector<float> f(64 * 1024, 1.2345678f);
  std::vector<uint8_t> out(f.size() * 4);
  std::memcpy(out.data(), f.data(), out.size());
  return out;
}

bool Contains(const std::vector<uint8_t>& hay, const uint8_t* needle,
              size_t n) {
  for (size_t i = 0; i + n <= hay.size(); ++i) {
    if (std::memcmp(hay.data() + i, needle, n) == 0) return true;
  }
  return false;
}

struct Sealed {
  std::vector<uint8_t> cipher;
  SealTag tag{};
};

Sealed SealIt(const WeightSeal& seal, uint64_t index,
              const std::vector<uint8_t>& plain,
              absl::Span<const uint8_t> aad = {}) {
  Sealed s;
  s.cipher.resize(plain.size());
  REQUIRE(seal.Seal(index, aad, plain, s.cipher.data(), &s.tag).ok());
  return s;
}

absl::Status OpenIt(const WeightSeal& seal, uint64_t index, const Sealed& s,
                    std::vector<uint8_t>* out,
                    absl::Span<const uint8_t> aad = {}) {
  out->assign(s.cipher.size(), 0xAA);
  return seal.Open(index, aad, s.cipher, s.tag, out->data(), "test");
}

TEST_CASE("a sealed piece opens bit-exact and hides its plaintext") {
  const DataPlaneKey key = Key(7);
  auto salt = NewSealSalt();
  REQUIRE(salt.ok());
  const WeightSeal seal = Derive(key, *salt);
  CHECK(seal.epoch() == 7);
  const std::vector<uint8_t> plain = Plain();
  const Sealed s = SealIt(seal, 3, plain);
  // Not one float of the pattern survives.
  CHECK_FALSE(Contains(s.cipher, plain.data(), 4));
  std::vector<uint8_t> out;
  REQUIRE(OpenIt(seal, 3, s, &out).ok());
  CHECK(out == plain);
  // Both sides derive the same key from the same secret and salt.
  REQUIRE(OpenIt(Derive(key, *salt), 3, s, &out).ok());
  CHECK(out == plain);
  // In place, in several parts.
  std::vector<uint8_t> buf = plain;
  const absl::Span<const uint8_t> parts[3] = {
      absl::MakeConstSpan(buf).subspan(0, 10),
      absl::MakeConstSpan(buf).subspan(10, 1000),
      absl::MakeConstSpan(buf).subspan(1010)};
  SealTag tag{};
  REQUIRE(seal.Seal(4, {}, parts, buf.data(), &tag).ok());
  REQUIRE(seal.Open(4, {}, buf, tag, buf.data(), "test").ok());
  CHECK(buf == plain);
  // Another salt is another key: the same piece index seals differently.
  auto salt2 = NewSealSalt();
  REQUIRE(salt2.ok());
  CHECK(SealIt(Derive(key, *salt2), 3, plain).cipher != s.cipher);
}

TEST_CASE("a tampered or misaddressed sealed piece is refused") {
  const DataPlaneKey key = Key(7);
  auto salt = NewSealSalt();
  REQUIRE(salt.ok());
  const WeightSeal seal = Derive(key, *salt);
  const std::vector<uint8_t> plain = Plain();
  const uint8_t aad[4] = {1, 2, 3, 4};
  const Sealed s = SealIt(seal, 9, plain, aad);
  std::vector<uint8_t> out;
  REQUIRE(OpenIt(seal, 9, s, &out, aad).ok());

  auto refused = [&](const WeightSeal& with, uint64_t index, const Sealed& t,
                     absl::Span<const uint8_t> a) {
    const absl::Status st = OpenIt(with, index, t, &out, a);
    INFO(st.ToString());
    CHECK(absl::IsDataLoss(st));
    // Nothing of the plaintext is left for anyone to read.
    CHECK(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0; }));
    return std::string(st.message());
  };
  SECTION("a ciphertext byte") {
    Sealed t = s;
    t.cipher[plain.size() / 2] ^= 0x01;
    const std::string message = refused(seal, 9, t, aad);
    CHECK(message.find("test: sealed piece 9 of 262144 bytes failed its "
                            "AES-256-GCM tag") == 0);
  }
  SECTION("a tag byte") {
    Sealed t = s;
    t.tag[15] ^= 0x80;
    refused(seal, 9, t, aad);
  }
  SECTION("another nonce (piece index)") { refused(seal, 10, s, aad); }
  SECTION("other associated data") {
    const uint8_t other[4] = {1, 2, 3, 5};
    refused(seal, 9, s, other);
  }
  SECTION("the wrong epoch's key") {
    refused(Derive(Key(8), *salt), 9, s, aad);
  }
  SECTION("the same secret under another epoch number") {
    DataPlaneKey renumbered = key;
    renumbered.epoch = 8;
    refused(Derive(renumbered, *salt), 9, s, aad);
  }
  SECTION("another salt") {
    auto salt2 = NewSealSalt();
    REQUIRE(salt2.ok());
    refused(Derive(key, *salt2), 9, s, aad);
  }
  SECTION("another purpose") {
    refused(Derive(key, *salt, kSealPurposeRaw), 9, s, aad);
  }
}

TEST_CASE("a salt of the wrong length is refused") {
  const uint8_t short_salt[16] = {};
  auto seal = WeightSeal::Derive(Key(1), short_salt, kSealPurposeRaw);
  REQUIRE(absl::IsInvalidArgument(seal.status()));
  CHECK(seal.status().message() ==
        "weight seal: salt of 16 bytes, expected 32");
}

}  // namespace
}  // namespace tandem::weights
