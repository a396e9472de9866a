#pragma once

// Certificates for tests of mutual TLS: a temporary directory, a
// development CA with one certificate per role in it (`tandemctl certs
// init`'s WriteDevCertificates), and a role's TLS options.

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>

#include "common/rpc/tls_options.h"
#include "services/tandemctl/certs_init.h"

namespace tandem::testing {

// A fresh directory under $TMPDIR (or /tmp), removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tandem_test") {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/" +
                          prefix + ".XXXXXX";
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A development CA and role certificates in a new directory.
inline std::unique_ptr<TempDir> IssuedCertificates() {
  auto dir = std::make_unique<TempDir>("certs");
  certs::CertsInitOptions options;
  options.dir = dir->path();
  REQUIRE(certs::WriteDevCertificates(options).ok());
  return dir;
}

// mtls options with `role`'s certificate from `dir`.
inline rpc::TlsOptions RoleTls(const TempDir& dir, const std::string& role,
                               int refresh_s = 0) {
  rpc::TlsOptions tls;
  tls.mode = "mtls";
  tls.cert = dir.File(role + ".pem");
  tls.key = dir.File(role + ".key");
  tls.ca = dir.File("ca.pem");
  if (refresh_s > 0) tls.refresh_s = refresh_s;
  return tls;
}

}  // namespace tandem::testing
