// The /metrics endpoint of each daemon's metric families serves text that
// Prometheus' own linter (`promtool check metrics`) accepts, and every
// family follows the tandem_ naming rules.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <regex>
#include <string>

#include "common/metrics/metrics_server.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/rollout/rollout_metrics.h"

namespace {

// Minimal HTTP/1.0 GET against host:port; returns the body.
std::string HttpGet(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  const int port = std::stoi(address.substr(colon + 1));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: x\r\n\r\n";
  REQUIRE(write(fd, request.data(), request.size()) ==
          static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  REQUIRE(body != std::string::npos);
  REQUIRE(response.rfind("HTTP/1.1 200", 0) == 0);
  return response.substr(body + 4);
}

struct CommandResult {
  int exit_code;
  std::string output;
};

CommandResult RunPromtool(const std::string& text) {
  char path[] = "/tmp/tandem_metrics_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, text.data(), text.size()) ==
          static_cast<ssize_t>(text.size()));
  close(fd);
  const std::string cmd =
      std::string("promtool check metrics < ") + path + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) output += buf;
  const int status = pclose(pipe);
  unlink(path);
  return {WEXITSTATUS(status), output};
}

TEST_CASE("daemon metric families pass promtool check metrics over HTTP") {
  auto registry = std::make_shared<prometheus::Registry>();
  tandem::coordinator::CoordinatorMetrics coordinator(*registry);
  tandem::rollout::RolloutMetrics rollout_metrics(*registry);
  coordinator.CountExpired(tandem::v1::ROLE_ROLLOUT);
  coordinator.SetMembers(tandem::v1::ROLE_ROLLOUT,
                         tandem::v1::MEMBER_STATE_ALIVE, 2);
  auto server =
      tandem::metrics::MetricsServer::Create("127.0.0.1:0", "test", registry);
  REQUIRE(server.ok());
  const std::string body = HttpGet((*server)->bound_address(), "/metrics");
  CHECK_THAT(
      body,
      Catch::Contains(
          "tandem_coordinator_members_expired_total{role=\"rollout\"} 1"));
  CHECK_THAT(body, Catch::Contains("tandem_build_info{"));
  const CommandResult result = RunPromtool(body);
  INFO(result.output);
  CHECK(result.exit_code == 0);
  CHECK(result.output.empty());
  // Every family is ours: tandem_ prefix (the exposer adds its own
  // exposer_* families, which are prometheus-cpp's).
  std::regex help_line("^# HELP ([a-z_:][a-z0-9_:]*) ");
  std::istringstream lines(body);
  std::string line;
  int families = 0;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, help_line)) continue;
    const std::string name = m[1];
    if (name.rfind("exposer_", 0) == 0) continue;
    INFO(name);
    CHECK(name.rfind("tandem_", 0) == 0);
    ++families;
  }
  CHECK(families >= 6);
}

TEST_CASE("promtool rejects a counter without the _total suffix") {
  // Guards the check above against a promtool that accepts everything.
  const CommandResult result = RunPromtool(
      "# HELP tandem_bad Bad.\n# TYPE tandem_bad counter\ntandem_bad 1\n");
  CHECK_FALSE(result.output.empty());
}

}  // namespace
