#include "common/config/daemon_flags.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

extern char** environ;

namespace tandem::config {

std::string HostOfAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos ||
      (address.find(':') != colon && address.front() != '[')) {
    return address;  // no port, or a bare IPv6 address
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

std::string ReachableHostOf(const std::string& address) {
  std::string host = HostOfAddress(address);
  if (host.empty() || host == "0.0.0.0" || host == "::") return "127.0.0.1";
  return host;
}

void AddServerOptions(ConfigSchema* schema, ServerOptions* options) {
  schema->AddString(
      "grpc_address", &options->grpc_address,
      "host:port where gRPC is served; port 0 picks a free port.");
  schema->AddString("metrics_address", &options->metrics_address,
                    "host:port of the Prometheus /metrics endpoint; port 0 "
                    "picks a free port; empty disables it.");
  schema->AddString("ready_file", &options->ready_file,
                    "If set, bound addresses are written here as JSON once "
                    "the daemon serves.");
  schema->AddEnum(
      "log.level", &options->log_level,
      {"trace", "debug", "info", "warn", "error", "critical", "off"},
      "Minimum log level.");
  schema->AddEnum("log.format", &options->log_format, {"text", "json"},
                  "Log line format on stderr.");
  schema->AddInt("drain_timeout_ms", &options->drain_timeout_ms, 0, 3'600'000,
                 "On SIGTERM, how long in-flight work may drain before the "
                 "daemon stops anyway.");
  AddTlsOptions(schema, &options->tls);
  schema->AddEnum(
      "metrics.tls", &options->metrics_tls, {"off", "tls", "mtls"},
      "TLS of the /metrics endpoint, whatever tls.mode says: off (plain "
      "HTTP), tls (HTTPS with tls.cert and tls.key) or mtls (HTTPS, and a "
      "scraper must present a certificate that chains to tls.ca).");
  // With tls.mode mtls AddTlsOptions' checks cover the files already.
  schema->AddCheck("metrics.tls", [options] {
    if (options->metrics_tls == "off" || options->tls.enabled()) {
      return absl::OkStatus();
    }
    const bool mutual = options->metrics_tls == "mtls";
    const std::pair<const char*, const std::string*> files[] = {
        {"tls.cert", &options->tls.cert},
        {"tls.key", &options->tls.key},
        {"tls.ca", mutual ? &options->tls.ca : nullptr}};
    for (const auto& [key, path] : files) {
      if (path != nullptr && path->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "is ", options->metrics_tls, " but ", key,
            " is not set (the /metrics endpoint presents tls.cert with "
            "tls.key", mutual ? "; mtls checks scrapers against tls.ca" : "",
            ")"));
      }
    }
    RETURN_IF_ERROR(rpc::CheckTlsFile(rpc::TlsFile::kCert, options->tls.cert));
    RETURN_IF_ERROR(rpc::CheckTlsFile(rpc::TlsFile::kKey, options->tls.key));
    if (mutual) {
      RETURN_IF_ERROR(rpc::CheckTlsFile(rpc::TlsFile::kCa, options->tls.ca));
    }
    return rpc::CheckKeyMatchesCert(options->tls.key, options->tls.cert);
  });
}

void AddTlsOptions(ConfigSchema* schema, rpc::TlsOptions* tls) {
  schema->AddEnum("tls.mode", &tls->mode, {"off", "mtls"},
                  "TLS of every gRPC server and client of this process: off "
                  "(plaintext) or mtls (both sides present a certificate "
                  "signed by tls.ca).");
  schema->AddString("tls.cert", &tls->cert,
                    "PEM certificate chain this process presents (mtls).");
  schema->AddString("tls.key", &tls->key,
                    "PEM private key of tls.cert (mtls).");
  schema->AddString("tls.ca", &tls->ca,
                    "PEM CA bundle peers' certificates must chain to (mtls).");
  schema->AddString(
      "tls.server_name", &tls->server_name,
      "Name checked against servers' certificates (DNS or IP SAN) instead "
      "of the host dialled; empty = the host dialled.");
  schema->AddInt("tls.refresh_s", &tls->refresh_s, 1, 86400,
                 "Seconds between re-reads of tls.cert, tls.key and tls.ca: "
                 "rotated files are used by new connections within this "
                 "time.");
  const std::pair<const char*, const std::string*> required[] = {
      {"tls.cert", &tls->cert}, {"tls.key", &tls->key}, {"tls.ca", &tls->ca}};
  for (const auto& [key, path] : required) {
    schema->AddCheck("tls.mode", [tls, key = std::string(key), path] {
      if (!tls->enabled() || !path->empty()) return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat("is mtls but ", key,
                       " is not set (mutual TLS needs tls.cert, tls.key and "
                       "tls.ca)"));
    });
  }
  const std::pair<const char*, rpc::TlsFile> files[] = {
      {"tls.cert", rpc::TlsFile::kCert},
      {"tls.key", rpc::TlsFile::kKey},
      {"tls.ca", rpc::TlsFile::kCa}};
  for (int i = 0; i < 3; ++i) {
    const std::string* path = required[i].second;
    const rpc::TlsFile kind = files[i].second;
    schema->AddCheck(files[i].first, [tls, path, kind] {
      if (!tls->enabled()) return absl::OkStatus();
      return rpc::CheckTlsFile(kind, *path);
    });
  }
  schema->AddCheck("tls.key", [tls] {
    if (!tls->enabled()) return absl::OkStatus();
    return rpc::CheckKeyMatchesCert(tls->key, tls->cert);
  });
}

namespace {

absl::Status ApplyLayers(
    ConfigSchema* schema, const std::string& config_file,
    const std::vector<std::string>& overrides,
    const std::vector<std::pair<std::string, std::string>>& flag_values) {
  if (!config_file.empty()) RETURN_IF_ERROR(schema->ApplyYamlFile(config_file));
  RETURN_IF_ERROR(schema->ApplyEnvironment(environ));
  for (const auto& assignment : overrides) {
    RETURN_IF_ERROR(schema->ApplyOverride(assignment));
  }
  for (const auto& [key, value] : flag_values) {
    RETURN_IF_ERROR(
        schema->SetFromText(key, value, absl::StrCat("flag for ", key)));
  }
  return absl::OkStatus();
}

}  // namespace

CommandLineResult LoadDaemonConfig(
    int argc, char** argv, const std::string& daemon_name, ConfigSchema* schema,
    const std::function<absl::Status()>& validate) {
  CLI::App app{absl::StrCat(daemon_name, ": a Tandem daemon")};
  std::string config_file;
  std::vector<std::string> overrides;
  std::string grpc_address, metrics_address, ready_file;
  bool print_config = false;
  app.add_option("--config", config_file, "YAML config file");
  app.add_option("--set", overrides,
                 "Override one key: key=value (repeatable)");
  app.add_option("--grpc-address", grpc_address, "host:port to serve gRPC on");
  app.add_option("--metrics-address", metrics_address,
                 "host:port to serve /metrics on");
  app.add_option("--ready-file", ready_file,
                 "Write bound addresses as JSON here once serving");
  app.add_flag("--print-config", print_config,
               "Print the effective configuration as YAML and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return {false, app.exit(e)};
  }
  std::vector<std::pair<std::string, std::string>> flag_values;
  if (!grpc_address.empty())
    flag_values.emplace_back("grpc_address", grpc_address);
  if (!metrics_address.empty()) {
    flag_values.emplace_back("metrics_address", metrics_address);
  }
  if (!ready_file.empty()) flag_values.emplace_back("ready_file", ready_file);

  absl::Status status =
      ApplyLayers(schema, config_file, overrides, flag_values);
  if (status.ok()) status = schema->Check();
  if (status.ok()) status = validate();
  if (!status.ok()) {
    std::cerr << daemon_name << ": configuration error: " << status.message()
              << "\n";
    return {false, 2};
  }
  if (print_config) {
    std::cout << "# Effective configuration of " << daemon_name << "\n"
              << schema->ToYaml();
    return {false, 0};
  }
  return {true, 0};
}

absl::Status WriteReadyFile(const std::string& path,
                            const std::string& grpc_address,
                            const std::string& metrics_address) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) {
      return absl::InternalError(absl::StrCat("cannot write ready file ", tmp));
    }
    out << "{\"grpc_address\": \"" << grpc_address
        << "\", \"metrics_address\": \"" << metrics_address
        << "\", \"pid\": " << getpid() << "}\n";
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat("cannot write ready file ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace tandem::config
