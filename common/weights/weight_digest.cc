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

absl::StatusOr<std::string> WeightSha256(absl::Span<const uint8_t> bytes) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                              EVP_MD_CTX_free);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), out, &len) != 1 ||
      len != kWeightSha256Bytes) {
    return absl::InternalError(absl::StrCat(
        "SHA-256 of ", bytes.size(), " weight bytes failed in OpenSSL"));
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string DigestPrefixHex(const std::string& digest, size_t n) {
  return absl::BytesToHexString(digest.substr(0, n));
}

absl::Status VerifyWeightSha256(uint64_t version, const std::string& expected,
                                absl::Span<const uint8_t> flat) {
  if (expected.size() != kWeightSha256Bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights v", version, ": manifest sha256 is ", expected.size(),
        " bytes, expected ", kWeightSha256Bytes));
  }
  absl::StatusOr<std::string> actual = WeightSha256(flat);
  if (!actual.ok()) return actual.status();
  if (*actual != expected) {
    return absl::DataLossError(absl::StrCat(
        "weights v", version, " refused: ", kMismatch, " over ", flat.size(),
        " bytes: expected ", DigestPrefixHex(expected), "…, got ",
        DigestPrefixHex(*actual), "…"));
  }
  return absl::OkStatus();
}

bool IsDigestMismatch(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDataLoss &&
         absl::StrContains(status.message(), kMismatch);
}

}  // namespace tandem::weights
