#include "common/rpc/tls_options.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::rpc {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read '", path, "': ", std::strerror(errno)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read '", path, "': ", std::strerror(errno)));
  }
  return buffer.str();
}

BioPtr MemoryBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// The first certificate in `path`, or an error that names the file.
absl::StatusOr<X509Ptr> FirstCertificate(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  BioPtr bio = MemoryBio(text);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' holds no PEM certificate"));
  }
  return cert;
}

absl::StatusOr<PkeyPtr> PrivateKey(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  BioPtr bio = MemoryBio(text);
  // A null password callback with an empty password: an encrypted key is
  // refused rather than prompting on the terminal.
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr,
                                      const_cast<char*>("")));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' holds no unencrypted PEM private key"));
  }
  return key;
}

}  // namespace

absl::Status CheckTlsFile(TlsFile kind, const std::string& path) {
  if (kind == TlsFile::kKey) return PrivateKey(path).status();
  return FirstCertificate(path).status();
}

absl::Status CheckKeyMatchesCert(const std::string& key_path,
                                 const std::string& cert_path) {
  ASSIGN_OR_RETURN(PkeyPtr key, PrivateKey(key_path));
  ASSIGN_OR_RETURN(X509Ptr cert, FirstCertificate(cert_path));
  const int match = X509_check_private_key(cert.get(), key.get());
  ERR_clear_error();
  if (match != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the private key in '", key_path,
        "' does not belong to the certificate in '", cert_path, "'"));
  }
  return absl::OkStatus();
}

absl::Status CheckTlsOptions(const TlsOptions& options) {
  if (options.mode != "off" && options.mode != "mtls") {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls.mode: must be one of off, mtls; got '", options.mode, "'"));
  }
  if (!options.enabled()) return absl::OkStatus();
  const std::pair<const char*, const std::string*> files[] = {
      {"cert", &options.cert}, {"key", &options.key}, {"ca", &options.ca}};
  for (const auto& [name, path] : files) {
    if (path->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tls.", name, ": must be set when tls.mode is mtls"));
    }
  }
  const std::pair<TlsFile, const char*> kinds[] = {
      {TlsFile::kCert, "cert"}, {TlsFile::kKey, "key"}, {TlsFile::kCa, "ca"}};
  for (int i = 0; i < 3; ++i) {
    if (absl::Status s = CheckTlsFile(kinds[i].first, *files[i].second);
        !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("tls.", kinds[i].second, ": ", s.message()));
    }
  }
  if (absl::Status s = CheckKeyMatchesCert(options.key, options.cert);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("tls.key: ", s.message()));
  }
  if (options.refresh_s < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls.refresh_s: must be at least 1, got ", options.refresh_s));
  }
  return absl::OkStatus();
}

bool IsLoopbackHost(const std::string& host) {
  const std::string lower = absl::AsciiStrToLower(host);
  return lower == "localhost" || lower == "::1" ||
         absl::StartsWith(lower, "127.");
}

}  // namespace tandem::rpc
