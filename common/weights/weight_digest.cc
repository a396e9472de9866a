#include "common/weights/weight_digest.h"

#include <openssl/evp.h>

#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem::weights {
namespace {

constexpr absl::string_view kMismatch = "sha256 mismatch";

}  // namespace

struct Sha256Hasher::Context {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx{EVP_MD_CTX_new(),
                                                              EVP_MD_CTX_free};
};

Sha256Hasher::Sha256Hasher() : context_(new Context) {
  failed_ = context_->ctx == nullptr ||
            EVP_DigestInit_ex(context_->ctx.get(), EVP_sha256(), nullptr) != 1;
}

Sha256Hasher::~Sha256Hasher() { delete context_; }

void Sha256Hasher::Update(absl::Span<const uint8_t> piece) {
  bytes_ += piece.size();
  if (failed_ || piece.empty()) return;
  failed_ = EVP_DigestUpdate(context_->ctx.get(), piece.data(),
                             piece.size()) != 1;
}

absl::StatusOr<std::string> Sha256Hasher::Finish() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (failed_ ||
      EVP_DigestFinal_ex(context_->ctx.get(), out, &len) != 1 ||
      len != kWeightSha256Bytes) {
    failed_ = true;
    return absl::InternalError(absl::StrCat(
        "SHA-256 of ", bytes_, " weight bytes failed in OpenSSL"));
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

absl::StatusOr<std::string> WeightSha256(absl::Span<const uint8_t> bytes) {
  Sha256Hasher hasher;
  hasher.Update(bytes);
  return hasher.Finish();
}

std::string DigestPrefixHex(const std::string& digest, size_t n) {
  return absl::BytesToHexString(digest.substr(0, n));
}

absl::Status VerifyWeightSha256(uint64_t version, const std::string& expected,
                                absl::Span<const uint8_t> flat) {
  if (expected.size() != kWeightSha256Bytes) {
    return CheckWeightSha256(version, expected, "", flat.size());
  }
  absl::StatusOr<std::string> actual = WeightSha256(flat);
  if (!actual.ok()) return actual.status();
  return CheckWeightSha256(version, expected, *actual, flat.size());
}

absl::Status CheckWeightSha256(uint64_t version, const std::string& expected,
                               const std::string& actual, uint64_t size) {
  if (expected.size() != kWeightSha256Bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights v", version, ": manifest sha256 is ", expected.size(),
        " bytes, expected ", kWeightSha256Bytes));
  }
  if (actual != expected) {
    return absl::DataLossError(absl::StrCat(
        "weights v", version, " refused: ", kMismatch, " over ", size,
        " bytes: expected ", DigestPrefixHex(expected), "…, got ",
        DigestPrefixHex(actual), "…"));
  }
  return absl::OkStatus();
}

bool IsDigestMismatch(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDataLoss &&
         absl::StrContains(status.message(), kMismatch);
}

}  // namespace tandem::weights
