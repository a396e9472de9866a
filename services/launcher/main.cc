// tandem-local: runs a whole Tandem cluster on this machine.
//
// Starts one coordinator, one trainer, one verifier and N rollout workers as
// separate processes on loopback, restarts any that crash (with backoff),
// shows live status, writes each daemon's log under the run directory, and
// stops everything cleanly on Ctrl-C / SIGTERM (or after --duration).

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/grpc_client.h"
#include "services/launcher/embedded_config.h"
#include "services/launcher/process_supervisor.h"
#include "services/tandemctl/cluster_status.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace fs = std::filesystem;

namespace tandem::launcher {
namespace {

struct Options {
  int rollout_workers = 2;
  std::string run_dir;
  std::string config_dir;
  std::string bin_dir;
  double duration_s = 0;
  double status_interval_s = 1;
  int64_t drain_timeout_ms = 10000;
};

void Event(const std::string& line) {
  const std::string stamp =
      absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone());
  std::cout << "\r\033[K[" << stamp << "] " << line << std::endl;
}

std::string ExeDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

// Reads {"grpc_address": ...} from a ready file; empty until it exists.
std::map<std::string, std::string> ReadReadyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    return {{"grpc_address", j.value("grpc_address", "")},
            {"metrics_address", j.value("metrics_address", "")},
            {"pid", std::to_string(j.value("pid", 0))}};
  } catch (const nlohmann::json::exception&) {
    return {};
  }
}

// Writes the daemon's config file into the run directory: the user's file
// from --config-dir if present, else the embedded default.
std::string PrepareConfig(const Options& options, const std::string& daemon) {
  const fs::path out =
      fs::path(options.run_dir) / "config" / (daemon + ".yaml");
  if (!options.config_dir.empty()) {
    const fs::path user = fs::path(options.config_dir) / (daemon + ".yaml");
    if (fs::exists(user)) {
      fs::copy_file(user, out, fs::copy_options::overwrite_existing);
      return out.string();
    }
  }
  std::ofstream(out) << EmbeddedConfig(daemon);
  return out.string();
}

class Launcher {
 public:
  explicit Launcher(Options options)
      : options_(std::move(options)), supervisor_(Event) {}

  int Run() {
    for (const char* sub : {"config", "logs", "ready"}) {
      fs::create_directories(fs::path(options_.run_dir) / sub);
    }
    Event(absl::StrCat("run directory ", options_.run_dir));
    if (!StartCoordinator()) {
      supervisor_.StopAll(absl::Seconds(5));
      return 1;
    }
    StartMember("trainer", "trainer");
    StartMember("verifier", "verifier");
    for (int i = 0; i < options_.rollout_workers; ++i) {
      StartMember("rollout", absl::StrCat("rollout-", i));
    }
    const int signal_number = Supervise();
    Event(signal_number > 0
              ? absl::StrCat("received ", strsignal(signal_number),
                             "; stopping the cluster")
              : "duration reached; stopping the cluster");
    const bool clean = supervisor_.StopAll(
        absl::Milliseconds(options_.drain_timeout_ms) + absl::Seconds(5));
    Event(clean ? "all daemons exited cleanly"
                : "some daemons did not exit cleanly (see logs)");
    return clean ? 0 : 1;
  }

 private:
  std::string Binary(const std::string& daemon) const {
    return (fs::path(options_.bin_dir) / ("tandem-" + daemon)).string();
  }
  std::string ReadyPath(const std::string& name) const {
    return (fs::path(options_.run_dir) / "ready" / (name + ".json")).string();
  }
  std::string LogPath(const std::string& name) const {
    return (fs::path(options_.run_dir) / "logs" / (name + ".log")).string();
  }

  std::vector<std::string> Argv(const std::string& daemon,
                                const std::string& name,
                                const std::string& grpc_address) {
    std::vector<std::string> argv = {
        Binary(daemon),
        "--config",
        PrepareConfig(options_, daemon),
        "--grpc-address",
        grpc_address,
        "--metrics-address",
        "127.0.0.1:0",
        "--ready-file",
        ReadyPath(name),
        "--set",
        absl::StrCat("drain_timeout_ms=", options_.drain_timeout_ms)};
    if (daemon == "coordinator") {
      // The journal lives in the run directory, so a restarted coordinator
      // resumes where it stopped (unless the user's config says otherwise).
      if (options_.config_dir.empty() ||
          !fs::exists(fs::path(options_.config_dir) / "coordinator.yaml")) {
        argv.push_back("--set");
        argv.push_back("journal.dir=" +
                       (fs::path(options_.run_dir) / "journal").string());
      }
    } else {
      argv.push_back("--set");
      argv.push_back("coordinator_address=" + coordinator_address_);
    }
    return argv;
  }

  bool StartCoordinator() {
    ProcessSpec spec{"coordinator",
                     Argv("coordinator", "coordinator", "127.0.0.1:0"),
                     LogPath("coordinator"), ReadyPath("coordinator")};
    if (absl::Status s = supervisor_.Start(spec); !s.ok()) {
      Event(std::string(s.message()));
      return false;
    }
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up) {
      auto ready = ReadReadyFile(spec.ready_file);
      if (!ready.empty()) {
        coordinator_address_ = ready["grpc_address"];
        // A restarted coordinator must come back on the same address.
        supervisor_.UpdateArgv("coordinator", Argv("coordinator", "coordinator",
                                                   coordinator_address_));
        Event(absl::StrCat("coordinator serving on ", coordinator_address_));
        stub_ = tandem::v1::Coordinator::NewStub(
            rpc::MakeChannel(coordinator_address_));
        return true;
      }
      supervisor_.Poll();
      absl::SleepFor(absl::Milliseconds(50));
    }
    Event(absl::StrCat("coordinator did not become ready within 30s; see ",
                       spec.log_path));
    return false;
  }

  void StartMember(const std::string& daemon, const std::string& name) {
    ProcessSpec spec{name, Argv(daemon, name, "127.0.0.1:0"), LogPath(name),
                     ReadyPath(name)};
    if (absl::Status s = supervisor_.Start(spec); !s.ok()) {
      Event(std::string(s.message()));
    }
  }

  void ShowStatus(bool final_table) {
    tandem::v1::GetClusterStatusResponse status;
    grpc::ClientContext context;
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    grpc::Status rpc = stub_->GetClusterStatus(
        &context, tandem::v1::GetClusterStatusRequest(), &status);
    const std::string line =
        rpc.ok()
            ? ctl::FormatStatusLine(status)
            : absl::StrCat("coordinator unreachable: ", rpc.error_message());
    if (final_table && rpc.ok()) {
      std::cout << "\r\033[K"
                << ctl::FormatClusterStatus(status,
                                            absl::ToUnixMillis(absl::Now()))
                << std::flush;
    } else if (isatty(STDOUT_FILENO)) {
      std::cout << "\r\033[K" << line << std::flush;
    } else {
      Event(line);
    }
  }

  // Returns the signal that ended supervision, or 0 when --duration elapsed.
  int Supervise() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    const absl::Time end =
        options_.duration_s > 0
            ? absl::Now() + absl::Seconds(options_.duration_s)
            : absl::InfiniteFuture();
    const absl::Duration status_every = absl::Seconds(
        isatty(STDOUT_FILENO) ? options_.status_interval_s
                              : std::max(5.0, options_.status_interval_s));
    absl::Time next_status = absl::Now() + absl::Seconds(2);
    bool showed_table = false;
    while (absl::Now() < end) {
      timespec tick{0, 100 * 1000 * 1000};
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig > 0) return sig;
      supervisor_.Poll();
      if (absl::Now() >= next_status) {
        ShowStatus(!showed_table);
        showed_table = true;
        next_status = absl::Now() + status_every;
      }
    }
    return 0;
  }

  Options options_;
  ProcessSupervisor supervisor_;
  std::string coordinator_address_;
  std::unique_ptr<tandem::v1::Coordinator::Stub> stub_;
};

}  // namespace
}  // namespace tandem::launcher

int main(int argc, char** argv) {
  using tandem::launcher::Options;
  Options options;
  options.bin_dir = tandem::launcher::ExeDir();
  CLI::App app{
      "tandem-local: run a Tandem cluster (coordinator, trainer, verifier, N "
      "rollout workers) as local processes"};
  app.add_option("--rollout-workers", options.rollout_workers,
                 "Rollout worker processes")
      ->check(CLI::Range(1, 64));
  app.add_option("--run-dir", options.run_dir,
                 "Directory for configs, logs and ready files "
                 "(default run/<timestamp>)");
  app.add_option("--config-dir", options.config_dir,
                 "Directory with <daemon>.yaml files replacing the embedded "
                 "defaults");
  app.add_option("--bin-dir", options.bin_dir,
                 "Directory holding the tandem-* binaries");
  app.add_option("--duration", options.duration_s,
                 "Stop after this many seconds (0 = until Ctrl-C)");
  app.add_option("--status-interval", options.status_interval_s,
                 "Seconds between status updates on a terminal");
  app.add_option("--drain-timeout-ms", options.drain_timeout_ms,
                 "How long each daemon may drain on shutdown");
  CLI11_PARSE(app, argc, argv);
  if (options.run_dir.empty()) {
    options.run_dir = "run/" + absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(),
                                                absl::LocalTimeZone());
  }
  options.run_dir = std::filesystem::absolute(options.run_dir).string();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return tandem::launcher::Launcher(options).Run();
}
