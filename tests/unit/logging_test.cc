// JSON log lines stay valid JSON whatever the message contains.

#include "common/base/logging.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace tandem {
namespace {

TEST_CASE("json log lines escape quotes, backslashes and control characters") {
  REQUIRE(InitLogging({"info", LogFormat::kJson}).ok());
  // Capture stderr through a pipe.
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const int saved = dup(STDERR_FILENO);
  dup2(fds[1], STDERR_FILENO);
  const std::string message = "path \"C:\\tmp\"\ttab\nnewline \x01 end";
  ComponentLogger("jsontest")->info("{}", message);
  ComponentLogger("jsontest")->flush();
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fds[0]);
  REQUIRE(!out.empty());
  REQUIRE(out.back() == '\n');
  const std::string line = out.substr(0, out.size() - 1);
  CHECK(line.find('\n') == std::string::npos);
  const nlohmann::json parsed = nlohmann::json::parse(line);
  CHECK(parsed["msg"] == message);
  CHECK(parsed["component"] == "jsontest");
  CHECK(parsed["level"] == "info");
}

TEST_CASE("an unknown log level is refused with the value") {
  absl::Status s = InitLogging({"loud", LogFormat::kText});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("'loud'"));
}

}  // namespace
}  // namespace tandem
