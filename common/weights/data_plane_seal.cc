#include "common/weights/data_plane_seal.h"

#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace tandem::weights {
namespace {

struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

std::array<uint8_t, 12> Nonce(uint64_t index) {
  std::array<uint8_t, 12> iv{};
  for (int i = 0; i < 8; ++i) iv[4 + i] = static_cast<uint8_t>(index >> (8 * i));
  return iv;
}

// OpenSSL's length arguments are ints: large spans go in steps.
constexpr size_t kStep = size_t{1} << 30;

}  // namespace

absl::StatusOr<SealSalt> NewSealSalt() {
  SealSalt salt{};
  if (RAND_bytes(salt.data(), static_cast<int>(salt.size())) != 1) {
    return absl::InternalError("RAND_bytes failed making a seal salt");
  }
  return salt;
}

absl::StatusOr<WeightSeal> WeightSeal::Derive(const DataPlaneKey& key,
                                              absl::Span<const uint8_t> salt,
                                              absl::string_view purpose) {
  if (salt.size() != kSealSaltBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight seal: salt of ", salt.size(), " bytes, expected ",
                     kSealSaltBytes));
  }
  std::string info(kSealContext, sizeof(kSealContext));  // with its NUL
  info.append(purpose.data(), purpose.size());
  info.push_back('\0');
  for (int i = 0; i < 8; ++i) {
    info.push_back(static_cast<char>(key.epoch >> (8 * i)));
  }
  std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree> ctx(
      EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  WeightSeal seal;
  seal.epoch_ = key.epoch;
  size_t out_len = seal.key_.size();
  if (ctx == nullptr || EVP_PKEY_derive_init(ctx.get()) <= 0 ||
      EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), salt.data(),
                                  static_cast<int>(salt.size())) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), key.secret.data(),
                                 static_cast<int>(key.secret.size())) <= 0 ||
      EVP_PKEY_CTX_add1_hkdf_info(
          ctx.get(), reinterpret_cast<const unsigned char*>(info.data()),
          static_cast<int>(info.size())) <= 0 ||
      EVP_PKEY_derive(ctx.get(), seal.key_.data(), &out_len) <= 0 ||
      out_len != seal.key_.size()) {
    return absl::InternalError("weight seal: HKDF-SHA256 failed");
  }
  return seal;
}

absl::Status WeightSeal::Seal(uint64_t index, absl::Span<const uint8_t> aad,
                              absl::Span<const absl::Span<const uint8_t>> parts,
                              uint8_t* out, SealTag* tag) const {
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  const std::array<uint8_t, 12> iv = Nonce(index);
  int len = 0;
  bool ok = ctx != nullptr &&
            EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr,
                               key_.data(), iv.data()) == 1 &&
            (aad.empty() ||
             EVP_EncryptUpdate(ctx.get(), nullptr, &len, aad.data(),
                               static_cast<int>(aad.size())) == 1);
  for (const absl::Span<const uint8_t>& part : parts) {
    for (size_t k = 0; ok && k < part.size(); k += kStep) {
      const size_t n = std::min(kStep, part.size() - k);
      ok = EVP_EncryptUpdate(ctx.get(), out, &len, part.data() + k,
                             static_cast<int>(n)) == 1;
      out += n;
    }
  }
  ok = ok && EVP_EncryptFinal_ex(ctx.get(), out, &len) == 1 &&
       EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kSealTagBytes,
                           tag->data()) == 1;
  if (!ok) {
    return absl::InternalError(
        absl::StrCat("weight seal: AES-256-GCM failed sealing piece ", index));
  }
  return absl::OkStatus();
}

absl::Status WeightSeal::Open(uint64_t index, absl::Span<const uint8_t> aad,
                              absl::Span<const uint8_t> cipher,
                              const SealTag& tag, uint8_t* out,
                              absl::string_view what) const {
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  const std::array<uint8_t, 12> iv = Nonce(index);
  int len = 0;
  bool ok = ctx != nullptr &&
            EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr,
                               key_.data(), iv.data()) == 1 &&
            (aad.empty() ||
             EVP_DecryptUpdate(ctx.get(), nullptr, &len, aad.data(),
                               static_cast<int>(aad.size())) == 1);
  for (size_t k = 0; ok && k < cipher.size(); k += kStep) {
    const size_t n = std::min(kStep, cipher.size() - k);
    ok = EVP_DecryptUpdate(ctx.get(), out + k, &len, cipher.data() + k,
                           static_cast<int>(n)) == 1;
  }
  SealTag want = tag;
  ok = ok &&
       EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kSealTagBytes,
                           want.data()) == 1 &&
       EVP_DecryptFinal_ex(ctx.get(), out + cipher.size(), &len) == 1;
  if (!ok) {
    if (!cipher.empty()) std::memset(out, 0, cipher.size());
    return absl::DataLossError(absl::StrCat(
        what, ": sealed piece ", index, " of ", cipher.size(),
        " bytes failed its AES-256-GCM tag (tampered, or not sealed with "
        "this process's data-plane epoch ", epoch_, " secret)"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::weights
