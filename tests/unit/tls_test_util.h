#pragma once

// Certificates for tests of mutual TLS: a development CA with one
// certificate per role in it (`tandemctl certs init`'s
// WriteDevCertificates), and a role's TLS options.

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>

#include "common/rpc/tls_options.h"
#include "services/tandemctl/certs_init.h"
#include "tests/support/temp_dir.h"

namespace tandem::testing {

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
