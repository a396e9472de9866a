#include "common/config/tls_flags.h"

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"

extern char** environ;

namespace tandem::config {
namespace {

constexpr const char* kKeys[] = {"mode", "cert",        "key",
                                 "ca",   "server_name", "refresh_s"};

std::string FlagName(const std::string& key) {
  std::string flag = "--tls-" + key;
  for (char& c : flag) {
    if (c == '_') c = '-';
  }
  return flag;
}

}  // namespace

void TlsFlags::AddTo(CLI::App* app) {
  for (const char* key : kKeys) {
    std::string& value = values_[key];
    app->add_option(
        FlagName(key), value,
        absl::StrCat("tls.", key, " (env ",
                     ConfigSchema::EnvName(absl::StrCat("tls.", key)),
                     "); see docs/operations.md, TLS"));
  }
}

absl::StatusOr<rpc::TlsOptions> TlsFlags::Resolve() const {
  rpc::TlsOptions tls;
  ConfigSchema schema;
  AddTlsOptions(&schema, &tls);
  RETURN_IF_ERROR(schema.ApplyEnvironment(environ));
  bool file_given = false;
  for (const char* key : kKeys) {
    auto it = values_.find(key);
    if (it == values_.end() || it->second.empty()) continue;
    const std::string path = absl::StrCat("tls.", key);
    RETURN_IF_ERROR(schema.SetFromText(
        path, it->second, absl::StrCat(FlagName(key), " ", it->second)));
    file_given |= path == "tls.cert" || path == "tls.key" || path == "tls.ca";
  }
  auto mode = values_.find("mode");
  if (file_given && (mode == values_.end() || mode->second.empty())) {
    RETURN_IF_ERROR(schema.SetFromText(
        "tls.mode", "mtls", "--tls-cert/--tls-key/--tls-ca (imply mtls)"));
  }
  RETURN_IF_ERROR(schema.Check());
  return tls;
}

}  // namespace tandem::config
