// Tests of the code verifier and its sandbox: each escape attempt is
// contained with its outcome, and the scorer keeps working right after.
//
// The isolation tests need root (network/PID namespaces, setuid to nobody),
// as in CI; without root they are skipped with a warning.

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/verifier/scoring/code_scorer.h"
#include "services/verifier/scoring/sandbox.h"

namespace tandem::verifier {
namespace {

namespace fs = std::filesystem;

bool IsRoot() { return geteuid() == 0; }

#define REQUIRE_ROOT_OR_SKIP()                                           \
  do {                                                                   \
    if (!IsRoot()) {                                                     \
      WARN("skipped: sandbox isolation tests need root (CI runs them)"); \
      return;                                                            \
    }                                                                    \
  } while (false)

// A work_root of its own, so that leftover processes (by cwd) and leftover
// run directories can be attributed to this test.
class WorkRoot {
 public:
  WorkRoot() {
    std::string path = "/tmp/verifier_sandbox_test_XXXXXX";
    REQUIRE(mkdtemp(path.data()) != nullptr);
    REQUIRE(chmod(path.c_str(), 0711) == 0);  // Searchable by nobody.
    path_ = path;
  }
  ~WorkRoot() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

  bool Empty() const { return fs::is_empty(path_); }

  // Processes whose working directory is (or was, if deleted) under here.
  int LiveProcesses() const {
    int count = 0;
    std::error_code ec;
    for (fs::directory_iterator it("/proc", ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string name = it->path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::error_code link_ec;  // The process may be gone by now.
      const fs::path cwd = fs::read_symlink(it->path() / "cwd", link_ec);
      if (!link_ec && absl::StartsWith(cwd.string(), path_)) ++count;
    }
    return count;
  }

 private:
  std::string path_;
};

SandboxConfig TestConfig(const WorkRoot& root) {
  SandboxConfig config;
  config.work_root = root.path();
  config.limits.cpu_seconds = 1;
  config.limits.wall_seconds = 2.0;
  config.limits.address_space_bytes = int64_t{256} << 20;
  config.limits.file_size_bytes = int64_t{1} << 20;
  config.limits.max_processes = 16;
  config.limits.max_output_bytes = 64 << 10;
  return config;
}

std::string Tests(const std::vector<std::pair<std::string, std::string>>&
                      stdin_and_expected) {
  nlohmann::json tests = nlohmann::json::array();
  for (const auto& [in, out] : stdin_and_expected) {
    tests.push_back({{"stdin", in}, {"expected_stdout", out}});
  }
  return tests.dump();
}

ScoreRequest CodeRequest(std::string program, std::string language,
                         std::string tests) {
  ScoreRequest request;
  request.completion_text = std::move(program);
  request.metadata = {{"language", std::move(language)},
                      {"tests", std::move(tests)}};
  return request;
}

constexpr char kSumProgram[] =
    "a, b = map(int, input().split())\nprint(a + b)\n";

// Scores a known-good program; every escape test calls it right after the
// escape attempt to prove the scorer still works.
void ExpectGoodProgramScoresOne(CodeScorer& scorer) {
  const ScoreResult result = scorer.Score(CodeRequest(
      kSumProgram, "python", Tests({{"1 2\n", "3\n"}, {"40 2", "42"}})));
  INFO("good program: " << result.outcome << ": " << result.reason);
  CHECK(result.reward == 1.0);
  CHECK(result.outcome == "correct");
}

struct Fixture {
  WorkRoot root;
  std::unique_ptr<CodeScorer> scorer;

  explicit Fixture(bool allow_network_fallback = false,
                   double wall_seconds = 2.0) {
    SandboxConfig config = TestConfig(root);
    config.limits.allow_network_fallback = allow_network_fallback;
    config.limits.wall_seconds = wall_seconds;
    auto created = CodeScorer::Create(config);
    REQUIRE(created.ok());
    scorer = *std::move(created);
  }

  ScoreResult Score(std::string program, std::string tests,
                    std::string language = "python") {
    const ScoreRequest request =
        CodeRequest(std::move(program), std::move(language), std::move(tests));
    REQUIRE(scorer->Validate(request).ok());
    return scorer->Score(request);
  }

  // Nothing of the run may survive it: no process, no directory.
  void ExpectNothingLeft() {
    CHECK(root.LiveProcesses() == 0);
    CHECK(root.Empty());
  }
};

TEST_CASE("code scores a correct program 1 in python and shell", "[code]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  ExpectGoodProgramScoresOne(*f.scorer);
  const ScoreResult sh =
      f.Score("read a b\necho $((a + b))\n",
              Tests({{"2 3\n", "5\n"}, {"-1 1\n", "0"}}), "sh");
  INFO(sh.reason);
  CHECK(sh.reward == 1.0);
  // The program is taken from the last fenced block of the completion.
  const ScoreResult fenced = f.Score(
      "Here is my solution:\n```python\nprint('wrong')\n```\nBetter:\n"
      "```python\nprint(input()[::-1])\n```\nDone.",
      Tests({{"abc\n", "cba\n"}}));
  INFO(fenced.reason);
  CHECK(fenced.reward == 1.0);
  f.ExpectNothingLeft();
}

TEST_CASE("code gives fractional reward for partial passes", "[code]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  // Wrong for negative numbers: passes 2 of 4.
  const ScoreResult result = f.Score(
      "a, b = map(int, input().split())\nprint(abs(a) + abs(b))\n",
      Tests({{"1 2", "3"}, {"-1 2", "1"}, {"5 5", "10"}, {"-3 -3", "-6"}}));
  INFO(result.reason);
  CHECK(result.reward == Approx(0.5));
  CHECK(result.outcome == "partial");
  CHECK(absl::StrContains(result.reason, "passed 2/4"));

  const ScoreResult wrong = f.Score("print(0)", Tests({{"1 2", "3"}}));
  CHECK(wrong.reward == 0.0);
  CHECK(wrong.outcome == "incorrect");

  const ScoreResult crash =
      f.Score("raise ValueError('boom')", Tests({{"", ""}}));
  CHECK(crash.outcome == "runtime_error");
  CHECK(absl::StrContains(crash.reason, "boom"));
  f.ExpectNothingLeft();
}

TEST_CASE("code contains an infinite loop with the CPU limit", "[escape]") {
  REQUIRE_ROOT_OR_SKIP();
  // A wall-clock limit far above the 1 s CPU limit, so that RLIMIT_CPU is
  // what stops the loop even on a loaded machine.
  Fixture f(/*allow_network_fallback=*/false, /*wall_seconds=*/10.0);
  const auto start = std::chrono::steady_clock::now();
  const ScoreResult result =
      f.Score("while True:\n    pass\n", Tests({{"", "x"}, {"", "y"}}));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  INFO(result.reason);
  CHECK(result.reward == 0.0);
  CHECK(result.outcome == "timeout");
  CHECK(absl::StrContains(result.reason, "CPU limit"));
  CHECK(result.sandbox_kills == std::vector<absl::string_view>{kKillCpu});
  // The first timeout ends the run; the second test is not run.
  CHECK(elapsed < std::chrono::seconds(9));
  f.ExpectNothingLeft();
  ExpectGoodProgramScoresOne(*f.scorer);
}

TEST_CASE("code contains a sleeping program with the wall-clock limit",
          "[escape]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  const ScoreResult result =
      f.Score("import time\ntime.sleep(600)\n", Tests({{"", ""}}));
  INFO(result.reason);
  CHECK(result.reward == 0.0);
  CHECK(result.outcome == "timeout");
  CHECK(absl::StrContains(result.reason, "wall-clock"));
  CHECK(result.sandbox_kills == std::vector<absl::string_view>{kKillWall});
  f.ExpectNothingLeft();
  ExpectGoodProgramScoresOne(*f.scorer);
}

TEST_CASE(
    "code stops a run at the request's deadline and on its cancel flag, "
    "long before the sandbox limits, and leaves nothing behind",
    "[code][deadline]") {
  REQUIRE_ROOT_OR_SKIP();
  // Limits the program would never reach in this test: only the request's
  // deadline or cancellation can end it (or the test's own timeout).
  Fixture f(/*allow_network_fallback=*/false, /*wall_seconds=*/600.0);
  ScoreRequest request = CodeRequest("import time\ntime.sleep(600)\n",
                                     "python", Tests({{"", ""}, {"", ""}}));

  SECTION("deadline") {
    request.deadline = absl::Now() + absl::Milliseconds(300);
    const ScoreResult result = f.scorer->Score(request);
    INFO(result.reason);
    CHECK(result.stopped);
    CHECK(result.reward == 0.0);
    CHECK(result.outcome == "timeout");
    CHECK(absl::StrContains(result.reason, "test 1 stopped"));
    CHECK(result.sandbox_kills.empty());
  }
  SECTION("cancel flag") {
    std::atomic<bool> cancelled{false};
    request.cancelled = &cancelled;
    std::thread canceller([&] {
      absl::SleepFor(absl::Milliseconds(300));
      cancelled.store(true);
    });
    const ScoreResult result = f.scorer->Score(request);
    canceller.join();
    INFO(result.reason);
    CHECK(result.stopped);
    CHECK(result.outcome == "timeout");
  }
  SECTION("cancelled before it starts: nothing runs") {
    std::atomic<bool> cancelled{true};
    request.cancelled = &cancelled;
    const ScoreResult result = f.scorer->Score(request);
    INFO(result.reason);
    CHECK(result.stopped);
    CHECK(absl::StrContains(result.reason, "test 1 not run"));
  }
  f.ExpectNothingLeft();
  ExpectGoodProgramScoresOne(*f.scorer);
}

TEST_CASE("code contains a fork bomb and leaves no process behind",
          "[escape]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  const ScoreResult result = f.Score(
      "import os\n"
      "while True:\n"
      "    try:\n"
      "        os.fork()\n"
      "    except OSError:\n"
      "        pass\n",
      Tests({{"", "done"}}));
  INFO(result.reason);
  CHECK(result.reward == 0.0);
  CHECK(result.outcome == "timeout");
  f.ExpectNothingLeft();
  ExpectGoodProgramScoresOne(*f.scorer);
  f.ExpectNothingLeft();
}

TEST_CASE("code contains a shell fork bomb", "[escape]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  const ScoreResult result =
      f.Score("bomb() { bomb | bomb; }\nbomb\n", Tests({{"", "done"}}), "sh");
  INFO(result.reason);
  CHECK(result.reward == 0.0);
  // dash gives up with "Cannot fork" once RLIMIT_NPROC is reached, or the
  // wall clock ends it first.
  CHECK((result.outcome == "runtime_error" || result.outcome == "timeout"));
  f.ExpectNothingLeft();
  ExpectGoodProgramScoresOne(*f.scorer);
}

TEST_CASE("code limits processes and open files", "[isolation]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  // RLIMIT_NPROC (16 in these tests) stops fork() with EAGAIN.
  const ScoreResult processes = f.Score(
      "import os, time\n"
      "n = 0\n"
      "try:\n"
      "    while n < 100:\n"
      "        if os.fork() == 0:\n"
      "            time.sleep(60)\n"
      "            os._exit(0)\n"
      "        n += 1\n"
      "    print('unlimited')\n"
      "except OSError as e:\n"
      "    print('limited', e.errno, n < 16)\n",
      Tests({{"", "limited 11 True"}}));
  INFO(processes.reason);
  CHECK(processes.reward == 1.0);
  // RLIMIT_NOFILE (64 by default) stops open() with EMFILE.
  const ScoreResult files = f.Score(
      "import os\n"
      "fds = []\n"
      "try:\n"
      "    for _ in range(1000):\n"
      "        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
      "    print('unlimited')\n"
      "except OSError as e:\n"
      "    print('limited', e.errno, len(fds) < 64)\n",
      Tests({{"", "limited 24 True"}}));
  INFO(files.reason);
  CHECK(files.reward == 1.0);
  f.ExpectNothingLeft();
}

TEST_CASE("code kills a child that left the process group with setsid",
          "[escape]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  // The parent exits at once and correctly; its detached child would sleep
  // for ten minutes if the PID namespace did not take it down.
  const ScoreResult result = f.Score(
      "import os, time\n"
      "if os.fork() == 0:\n"
      "    os.setsid()\n"
      "    os.close(1)\n"
      "    os.close(2)\n"
      "    time.sleep(600)\n"
      "print('ok')\n",
      Tests({{"", "ok"}}));
  INFO(result.reason);
  CHECK(result.reward == 1.0);
  f.ExpectNothingLeft();
}

TEST_CASE("code contains a memory hog with the address-space limit",
          "[escape]") {
  REQUIRE_ROOT_OR_SKIP();
  // Filling 256 MiB can take seconds on a loaded machine; the address-space
  // limit, not the clock, must be what stops it.
  Fixture f(/*allow_network_fallback=*/false, /*wall_seconds=*/10.0);
  const ScoreResult result = f.Score(
      "chunks = []\n"
      "while True:\n"
      "    chunks.append(bytearray(1 << 20))\n",
      Tests({{"", ""}}));
  INFO(result.reason);
  CHECK(result.reward == 0.0);
  CHECK(result.outcome == "memory");
  f.ExpectNothingLeft();
  ExpectGoodProgramScoresOne(*f.scorer);
}

TEST_CASE("code contains huge output with the output cap", "[escape]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  const auto start = std::chrono::steady_clock::now();
  const ScoreResult result =
      f.Score("while True:\n    print('x' * 1000)\n", Tests({{"", "x"}}));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  INFO(result.reason);
  CHECK(result.reward == 0.0);
  CHECK(result.outcome == "output_limit");
  CHECK(elapsed < std::chrono::seconds(2));  // Killed at the cap, not later.
  CHECK(result.reason.size() < 1000);        // The reason stays bounded.
  CHECK(result.sandbox_kills == std::vector<absl::string_view>{kKillOutput});

  const ScoreResult big_file =
      f.Score("with open('big', 'wb') as f:\n    f.write(b'x' * (4 << 20))\n",
              Tests({{"", ""}}));
  INFO(big_file.reason);
  CHECK(big_file.reward == 0.0);
  CHECK(big_file.outcome == "output_limit");
  f.ExpectNothingLeft();
  ExpectGoodProgramScoresOne(*f.scorer);
}

TEST_CASE("code cannot reach the network, not even loopback", "[escape]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  // A listener of the test on loopback in the host's network namespace.
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ==
          0);
  REQUIRE(listen(listener, 4) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int port = ntohs(addr.sin_port);

  const ScoreResult result =
      f.Score(absl::StrCat("import socket\n"
                           "s = socket.create_connection(('127.0.0.1', ",
                           port,
                           "), timeout=1)\n"
                           "print('connected')\n"),
              Tests({{"", "connected"}}));
  INFO(result.reason);
  CHECK(result.reward == 0.0);
  CHECK(result.outcome == "runtime_error");
  CHECK(absl::StrContains(result.reason, "unreachable"));
  // Nothing arrived at the listener.
  CHECK(accept(listener, nullptr, nullptr) < 0);
  close(listener);
  f.ExpectNothingLeft();
  ExpectGoodProgramScoresOne(*f.scorer);
}

TEST_CASE("code runs as nobody with no inherited descriptors in a fresh dir",
          "[isolation]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  // An inheritable descriptor of the parent that must not leak.
  const int leaked = open("/dev/null", O_RDONLY);
  REQUIRE(leaked >= 0);
  const ScoreResult result = f.Score(
      "import os\n"
      "print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n"
      "fds = []\n"
      "for fd in range(3, 256):\n"
      "    try:\n"
      "        os.fstat(fd)\n"
      "        fds.append(fd)\n"
      "    except OSError:\n"
      "        pass\n"
      "print(fds)\n"
      "print(sorted(os.listdir('.')))\n"
      "print(os.getpid(), os.getppid())\n",
      // PID 2 under the sandbox's init, PID 1 of a fresh PID namespace.
      Tests({{"", "65534 65534 65534 []\n[]\n['main.py']\n2 1\n"}}));
  close(leaked);
  INFO(result.reason);
  CHECK(result.reward == 1.0);
  f.ExpectNothingLeft();
}

TEST_CASE("code does not inherit ignored or blocked signals", "[isolation]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  REQUIRE(sigaction(SIGUSR1, &ignore, &previous) == 0);
  sigset_t block, previous_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR2);
  REQUIRE(pthread_sigmask(SIG_BLOCK, &block, &previous_mask) == 0);
  const ScoreResult result = f.Score(
      "import signal\n"
      "print(signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL)\n"
      "print(signal.pthread_sigmask(signal.SIG_BLOCK, []))\n",
      Tests({{"", "True\nset()"}}));
  pthread_sigmask(SIG_SETMASK, &previous_mask, nullptr);
  sigaction(SIGUSR1, &previous, nullptr);
  INFO(result.reason);
  CHECK(result.reward == 1.0);
}

TEST_CASE("sandbox reports exit status, output and a removed directory",
          "[sandbox]") {
  REQUIRE_ROOT_OR_SKIP();
  WorkRoot root;
  auto sandbox = Sandbox::Create(TestConfig(root));
  REQUIRE(sandbox.ok());
  SandboxCommand command;
  command.argv = {"/bin/sh", "run.sh"};
  command.files = {{"run.sh", "cat; echo err >&2; pwd >&2; exit 3"}};
  command.stdin_data = "from stdin";
  auto result = (*sandbox)->Run(command);
  REQUIRE(result.ok());
  CHECK(result->termination == SandboxTermination::kExited);
  CHECK(result->exit_code == 3);
  CHECK(result->stdout_data == "from stdin");
  INFO("stderr: " << result->stderr_data);
  CHECK(absl::StartsWith(result->stderr_data, "err\n" + root.path() + "/"));
  CHECK(result->isolated);
  CHECK(root.Empty());

  // A large stdin is never a deadlock, even when it is not read; output
  // is cut at exactly the cap.
  SandboxCommand big_stdin;
  big_stdin.argv = {"/bin/sh", "-c", "wc -c"};
  big_stdin.stdin_data = std::string(1 << 20, 'x');
  auto counted = (*sandbox)->Run(big_stdin);
  REQUIRE(counted.ok());
  CHECK(counted->stdout_data == "1048576\n");
  SandboxCommand ignores_stdin;
  ignores_stdin.argv = {"/bin/sh", "-c", "exit 0"};
  ignores_stdin.stdin_data = std::string(1 << 20, 'x');
  REQUIRE((*sandbox)->Run(ignores_stdin).ok());
  SandboxCommand flood;
  flood.argv = {"/bin/sh", "-c", "while :; do echo xxxxxxxxxxxxxxx; done"};
  auto flooded = (*sandbox)->Run(flood);
  REQUIRE(flooded.ok());
  CHECK(flooded->termination == SandboxTermination::kOutputLimit);
  CHECK(flooded->stdout_data.size() == size_t{64 << 10});
  CHECK(root.Empty());

  SandboxCommand relative;
  relative.argv = {"sh"};
  CHECK(absl::IsInvalidArgument((*sandbox)->Run(relative).status()));
  SandboxCommand bad_file;
  bad_file.argv = {"/bin/true"};
  bad_file.files = {{"../escape", ""}};
  CHECK(absl::IsInvalidArgument((*sandbox)->Run(bad_file).status()));
}

TEST_CASE(
    "sandbox gives each run a private, read-only view: its own directory is "
    "the only writable place and other runs and daemon processes are hidden",
    "[isolation]") {
  REQUIRE_ROOT_OR_SKIP();
  WorkRoot root;
  // Something another run (or the daemon) left in work_root.
  const std::string other = root.path() + "/other-run";
  REQUIRE(mkdir(other.c_str(), 0777) == 0);
  auto sandbox = Sandbox::Create(TestConfig(root));
  REQUIRE(sandbox.ok());
  SandboxCommand command;
  command.argv = {"/usr/bin/python3", "probe.py"};
  command.files = {{"probe.py", absl::StrCat(R"(import os
def try_write(path):
    try:
        with open(path, 'w') as f:
            f.write('x')
        return 'wrote'
    except OSError as e:
        return type(e).__name__ + ':' + str(e.errno)
print('own', try_write('own.txt'))
print('tmp', try_write('/tmp/escape.txt'))
print('root', try_write(')", root.path(), R"(/escape.txt'))
print('devshm', try_write('/dev/shm/escape'))
print('siblings', sorted(os.listdir(')", root.path(), R"(')))
print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
print('run', os.listdir('/run'))
)")}};
  auto result = (*sandbox)->Run(command);
  REQUIRE(result.ok());
  INFO("stdout: " << result->stdout_data << "\nstderr: " << result->stderr_data);
  REQUIRE(result->termination == SandboxTermination::kExited);
  CHECK(result->exit_code == 0);
  CHECK(result->isolated);
  CHECK(result->private_filesystem);
  const std::string& out = result->stdout_data;
  CHECK(absl::StrContains(out, "own wrote\n"));
  // EROFS (30): nothing outside the run directory is writable.
  CHECK(absl::StrContains(out, "tmp OSError:30\n"));
  CHECK(absl::StrContains(out, "root OSError:30\n"));
  CHECK(absl::StrContains(out, "devshm OSError:30\n"));
  // Only its own run directory in work_root; "other-run" is out of sight.
  CHECK(absl::StrContains(out, "siblings ['tandem-sandbox-"));
  CHECK(!absl::StrContains(out, "other-run"));
  // /proc of the run's PID namespace: its init and itself.
  CHECK(absl::StrContains(out, "pids [1, 2]\n"));
  CHECK(absl::StrContains(out, "run []\n"));
  CHECK(!fs::exists("/tmp/escape.txt"));
  CHECK(!fs::exists(root.path() + "/escape.txt"));
  // The daemon's namespace is untouched: no mount leaked back.
  CHECK(fs::exists(other));
  REQUIRE(rmdir(other.c_str()) == 0);
  CHECK(root.Empty());
}

TEST_CASE(
    "sandbox keeps network and PID namespaces when a private view is "
    "refused",
    "[isolation]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  f.scorer->SandboxForTest().SimulateMountNamespaceFailureForTest(true);
  ExpectGoodProgramScoresOne(*f.scorer);
  const ScoreResult network = f.Score(
      "import socket\n"
      "socket.create_connection(('127.0.0.1', 9), timeout=1)\n",
      Tests({{"", ""}}));
  INFO(network.reason);
  CHECK(network.reward == 0.0);
  CHECK(absl::StrContains(network.reason, "unreachable"));
  SandboxCommand command;
  command.argv = {"/bin/sh", "-c", "echo $$"};
  auto result = f.scorer->SandboxForTest().Run(command);
  REQUIRE(result.ok());
  CHECK(result->isolated);
  CHECK(!result->private_filesystem);
  CHECK(result->stdout_data == "2\n");
  f.ExpectNothingLeft();
}

TEST_CASE(
    "sandbox run by an unprivileged daemon gets its namespaces and private "
    "view through a user namespace",
    "[isolation]") {
  REQUIRE_ROOT_OR_SKIP();  // To become nobody in a child process.
  WorkRoot root;
  REQUIRE(chown(root.path().c_str(), 65534, 65534) == 0);
  int report[2];
  REQUIRE(pipe(report) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The "daemon": nobody, no capabilities. Plain code only (no Catch2).
    close(report[0]);
    std::string out;
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0 ||
        // As a daemon started as nobody would be (changing uid cleared it,
        // and a non-dumpable process cannot write its child's uid_map).
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) {
      out = "setup failed";
    } else if (auto sandbox = Sandbox::Create(TestConfig(root));
               !sandbox.ok()) {
      out = std::string(sandbox.status().message());
    } else {
      SandboxCommand command;
      command.argv = {"/usr/bin/python3", "probe.py"};
      command.files = {{"probe.py", R"(import os, socket
print(os.getuid(), os.getpid())
try:
    open('/tmp/escape-unprivileged', 'w')
    print('tmp wrote')
except OSError as e:
    print('tmp', e.errno)
try:
    socket.create_connection(('127.0.0.1', 9), timeout=1)
    print('net connected')
except OSError as e:
    print('net', e.errno)
open('own.txt', 'w').write('x')
print('own ok')
)"}};
      auto result = (*sandbox)->Run(command);
      if (!result.ok()) {
        out = absl::StrCat("run: ", result.status().ToString());
      } else {
        out = absl::StrCat(result->isolated ? "isolated" : "unisolated", " ",
                           result->private_filesystem ? "private" : "shared",
                           "\n", result->stdout_data, result->stderr_data);
      }
    }
    ssize_t unused = write(report[1], out.data(), out.size());
    (void)unused;
    _exit(0);
  }
  close(report[1]);
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = read(report[0], buffer, sizeof(buffer))) > 0) out.append(buffer, n);
  close(report[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO(out);
  if (absl::StrContains(out, "UNAVAILABLE")) {
    WARN("skipped: this kernel refuses unprivileged user namespaces");
    return;
  }
  CHECK(absl::StartsWith(out, "isolated private\n"));
  CHECK(absl::StrContains(out, "65534 2\n"));  // Own uid; PID 2 under init.
  CHECK(absl::StrContains(out, "tmp 30\n"));   // EROFS
  CHECK(absl::StrContains(out, "net 101\n"));  // ENETUNREACH
  CHECK(absl::StrContains(out, "own ok\n"));
  CHECK(!fs::exists("/tmp/escape-unprivileged"));
  CHECK(root.Empty());
}

TEST_CASE("code refuses to run without namespaces unless fallback is allowed",
          "[isolation]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture strict;
  strict.scorer->SandboxForTest().SimulateNamespaceFailureForTest(true);
  const ScoreResult refused = strict.Score(kSumProgram, Tests({{"1 2", "3"}}));
  INFO(refused.reason);
  CHECK(refused.reward == 0.0);
  CHECK(refused.outcome == "sandbox_unavailable");
  strict.ExpectNothingLeft();

  Fixture fallback(/*allow_network_fallback=*/true);
  fallback.scorer->SandboxForTest().SimulateNamespaceFailureForTest(true);
  ExpectGoodProgramScoresOne(*fallback.scorer);
  // Without a PID namespace the process-group kill still reaps children
  // that stayed in the group.
  const ScoreResult background = fallback.Score(
      "import os, time\n"
      "if os.fork() == 0:\n"
      "    os.close(1)\n"
      "    os.close(2)\n"
      "    time.sleep(600)\n"
      "print('ok')\n",
      Tests({{"", "ok"}}));
  INFO(background.reason);
  CHECK(background.reward == 1.0);
  // SIGKILL delivery is asynchronous; give the kernel a moment.
  for (int i = 0; i < 50 && fallback.root.LiveProcesses() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fallback.ExpectNothingLeft();
}

TEST_CASE("code validates its metadata", "[code]") {
  WorkRoot root;
  auto scorer = CodeScorer::Create(TestConfig(root));
  REQUIRE(scorer.ok());
  const auto status = [&](std::map<std::string, std::string> metadata) {
    ScoreRequest request;
    request.completion_text = "print(1)";
    request.metadata = std::move(metadata);
    return (*scorer)->Validate(request);
  };
  const std::string ok_tests = Tests({{"", "1"}});
  CHECK(status({{"language", "python"}, {"tests", ok_tests}}).ok());
  const absl::Status no_tests = status({{"language", "python"}});
  CHECK(absl::IsInvalidArgument(no_tests));
  CHECK(absl::StrContains(no_tests.message(), "metadata.tests"));
  const absl::Status no_language = status({{"tests", ok_tests}});
  CHECK(absl::StrContains(no_language.message(), "metadata.language"));
  CHECK(absl::IsInvalidArgument(
      status({{"language", "cobol"}, {"tests", ok_tests}})));
  CHECK(absl::IsInvalidArgument(
      status({{"language", "python"}, {"tests", "[{"}})));
  CHECK(absl::IsInvalidArgument(
      status({{"language", "python"}, {"tests", "[]"}})));
  const absl::Status missing_field =
      status({{"language", "python"}, {"tests", R"([{"stdin": "1"}])"}});
  CHECK(absl::StrContains(missing_field.message(),
                          "metadata.tests[0].expected_stdout"));

  ScoreRequest empty;
  empty.completion_text = "  \n";
  empty.metadata = {{"language", "python"}, {"tests", ok_tests}};
  CHECK((*scorer)->Score(empty).outcome == "no_answer");
}

TEST_CASE("code scores concurrently", "[code]") {
  REQUIRE_ROOT_OR_SKIP();
  Fixture f;
  std::atomic<int> correct{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      const ScoreResult r = f.scorer->Score(CodeRequest(
          kSumProgram, "python", Tests({{"1 2", "3"}, {"3 4", "7"}})));
      if (r.reward == 1.0) ++correct;
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(correct.load() == 4);
  f.ExpectNothingLeft();
}

}  // namespace
}  // namespace tandem::verifier
