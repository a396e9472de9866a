#include "common/weights/pull/data_plane_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem::weights {
namespace {

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// HMAC-SHA256(secret, kProofContext || epoch || nonce).
std::array<uint8_t, 32> ProofMac(const DataPlaneKey& key, uint64_t epoch,
                                 const uint8_t* nonce) {
  uint8_t message[sizeof(kProofContext) + 8 + kDataPlaneNonceBytes];
  std::memcpy(message, kProofContext, sizeof(kProofContext));
  PutU64(message + sizeof(kProofContext), epoch);
  std::memcpy(message + sizeof(kProofContext) + 8, nonce,
              kDataPlaneNonceBytes);
  std::array<uint8_t, 32> mac{};
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key.secret.data(), static_cast<int>(key.secret.size()),
       message, sizeof(message), mac.data(), &mac_len);
  return mac;
}

}  // namespace

absl::StatusOr<DataPlaneKey> NewDataPlaneKey(uint64_t epoch) {
  DataPlaneKey key;
  key.epoch = epoch;
  if (RAND_bytes(key.secret.data(), static_cast<int>(key.secret.size())) !=
      1) {
    return absl::InternalError("RAND_bytes failed making a data-plane secret");
  }
  return key;
}

absl::StatusOr<DataPlaneKey> DataPlaneKeyFromBytes(
    uint64_t epoch, absl::Span<const uint8_t> secret) {
  if (secret.size() != kDataPlaneSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-plane secret of epoch ", epoch, " has ",
                     secret.size(), " bytes, expected ",
                     kDataPlaneSecretBytes));
  }
  DataPlaneKey key;
  key.epoch = epoch;
  std::memcpy(key.secret.data(), secret.data(), secret.size());
  return key;
}

absl::StatusOr<RawChallenge> NewRawChallenge(uint64_t epoch) {
  RawChallenge challenge{};
  PutU32(challenge.data(), kRawAuthMagic);
  PutU64(challenge.data() + 4, epoch);
  if (RAND_bytes(challenge.data() + 12, kDataPlaneNonceBytes) != 1) {
    return absl::InternalError("RAND_bytes failed making a challenge nonce");
  }
  return challenge;
}

absl::StatusOr<RawProof> ProveRawChallenge(absl::Span<const uint8_t> challenge,
                                           const DataPlaneKey& key) {
  if (challenge.size() != kRawChallengeBytes ||
      GetU32(challenge.data()) != kRawAuthMagic) {
    return absl::InvalidArgumentError(
        "raw weight data: the server sent no data-plane challenge");
  }
  const uint64_t epoch = GetU64(challenge.data() + 4);
  if (epoch != key.epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("raw weight data: the server is at data-plane epoch ",
                     epoch, ", this process holds the secret of epoch ",
                     key.epoch));
  }
  RawProof proof{};
  PutU32(proof.data(), kRawAuthMagic);
  PutU64(proof.data() + 4, epoch);
  const std::array<uint8_t, 32> mac =
      ProofMac(key, epoch, challenge.data() + 12);
  std::memcpy(proof.data() + 12, mac.data(), mac.size());
  return proof;
}

absl::Status VerifyRawProof(absl::Span<const uint8_t> proof,
                            const RawChallenge& challenge,
                            const DataPlaneKey& key, bool* stale) {
  if (stale != nullptr) *stale = false;
  if (proof.size() < 4 || GetU32(proof.data()) != kRawAuthMagic) {
    return absl::UnauthenticatedError(
        "raw weight data: no data-plane proof (the client holds no epoch "
        "secret, or sent garbage)");
  }
  if (proof.size() != kRawProofBytes) {
    return absl::UnauthenticatedError(
        absl::StrCat("raw weight data: truncated data-plane proof (",
                     proof.size(), " of ", kRawProofBytes, " bytes)"));
  }
  const uint64_t epoch = GetU64(proof.data() + 4);
  if (epoch != key.epoch) {
    if (stale != nullptr) *stale = true;
    return absl::UnauthenticatedError(
        absl::StrCat("raw weight data: proof for data-plane epoch ", epoch,
                     ", the current epoch is ", key.epoch, " (stale secret)"));
  }
  const std::array<uint8_t, 32> want =
      ProofMac(key, key.epoch, challenge.data() + 12);
  if (CRYPTO_memcmp(want.data(), proof.data() + 12, want.size()) != 0) {
    return absl::UnauthenticatedError(absl::StrCat(
        "raw weight data: wrong data-plane proof for epoch ", epoch));
  }
  return absl::OkStatus();
}

namespace {

void Wipe(std::optional<DataPlaneKey>* key) {
  if (!key->has_value()) return;
  OPENSSL_cleanse((*key)->secret.data(), (*key)->secret.size());
  key->reset();
}

}  // namespace

DataPlaneKeyHolder::~DataPlaneKeyHolder() {
  absl::MutexLock lock(&mu_);
  Wipe(&key_);
  Wipe(&previous_);
}

void DataPlaneKeyHolder::Set(const DataPlaneKey& key, absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  if (key_.has_value() && key_->epoch == key.epoch &&
      CRYPTO_memcmp(key_->secret.data(), key.secret.data(),
                    key.secret.size()) == 0) {
    return;  // the same epoch again
  }
  Wipe(&previous_);
  if (key_.has_value() && grace > absl::ZeroDuration()) {
    previous_ = key_;
    previous_until_ = clock_->Now() + grace;
  }
  Wipe(&key_);
  key_ = key;
}

std::optional<DataPlaneKey> DataPlaneKeyHolder::Get() const {
  absl::MutexLock lock(&mu_);
  return key_;
}

void DataPlaneKeyHolder::ExpireLocked() const {
  if (previous_.has_value() && clock_->Now() >= previous_until_) {
    Wipe(&previous_);
  }
}

std::optional<DataPlaneKey> DataPlaneKeyHolder::ForEpoch(
    uint64_t epoch) const {
  absl::MutexLock lock(&mu_);
  if (key_.has_value() && key_->epoch == epoch) return key_;
  ExpireLocked();
  if (previous_.has_value() && previous_->epoch == epoch) return previous_;
  return std::nullopt;
}

std::optional<uint64_t> DataPlaneKeyHolder::grace_epoch() const {
  absl::MutexLock lock(&mu_);
  ExpireLocked();
  if (!previous_.has_value()) return std::nullopt;
  return previous_->epoch;
}

absl::Duration DataPlaneKeyGrace(absl::Duration heartbeat_interval) {
  return 2 * heartbeat_interval;
}

std::function<void(const tandem::v1::DataPlaneSecret&, absl::Duration)>
DataPlaneSecretSink(std::shared_ptr<DataPlaneKeyHolder> holder,
                    std::string component) {
  return [holder = std::move(holder), component = std::move(component)](
             const tandem::v1::DataPlaneSecret& secret,
             absl::Duration heartbeat_interval) {
    absl::StatusOr<DataPlaneKey> key = DataPlaneKeyFromBytes(
        secret.epoch(),
        absl::MakeConstSpan(
            reinterpret_cast<const uint8_t*>(secret.secret().data()),
            secret.secret().size()));
    if (!key.ok()) {
      ComponentLogger(component)->error("ignoring the coordinator's {}",
                                        std::string(key.status().message()));
      return;
    }
    const absl::Duration grace = DataPlaneKeyGrace(heartbeat_interval);
    holder->Set(*key, grace);
    ComponentLogger(component)->info(
        "raw weight data: data-plane epoch {} (the previous epoch still "
        "opens sealed data for {})",
        secret.epoch(), absl::FormatDuration(grace));
  };
}

}  // namespace tandem::weights
