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
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/executable_dir.h"
#include "common/cluster/cluster_status.h"
#include "common/cluster/coordinator_client.h"
#include "common/config/tls_flags.h"
#include "common/rpc/grpc_client.h"
#include "services/launcher/embedded_config.h"
#include "services/launcher/process_supervisor.h"
#include "services/launcher/progress.h"
#include "services/launcher/tools_dataset.h"
#include "services/launcher/warm_start.h"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "tandem/v1/rollout.grpc.pb.h"
#include "tandem/v1/trainer.grpc.pb.h"

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
  // auto: on unless --config-dir is given.
  std::string warm_start = "auto";
  std::string cache_dir;
  // "arith" (the default) or "tools" (embedded_config.h).
  std::string task = "arith";
  // A Hugging Face model directory to run instead of the warm start's.
  std::string model;
  // TLS of the launcher's own status polls (the daemons take theirs from
  // their config files).
  rpc::TlsOptions tls;
};

// The warm start of the embedded default task (3-digit addition) is
// `tandem-trainer sft` with its defaults (sft::SftOptions), so that the
// launcher, the tests and the cached directory's key agree.
const std::vector<std::string>& WarmStartFlags() {
  static const std::vector<std::string> flags;
  return flags;
}

// The warm start of --task tools: demonstrations of calculator episodes
// (docs/environments.md, "The tools demo task"), landing partway as the
// default task's does, so that RL has room to raise held-out accuracy.
const std::vector<std::string>& ToolsWarmStartFlags() {
  static const std::vector<std::string> flags = {"--task",
                                                 "tools",
                                                 "--digits",
                                                 "4",
                                                 "--batch-size",
                                                 "16",
                                                 "--steps",
                                                 "1500",
                                                 "--eval-every",
                                                 "50",
                                                 "--eval-problems",
                                                 "128",
                                                 "--target-accuracy",
                                                 "0.3",
                                                 "--max-accuracy",
                                                 "0.7"};
  return flags;
}

// Train-split problems in the tools task's dataset (one epoch of it is far
// more than a demo run leases).
constexpr int64_t kToolsDatasetRows = 20000;

void Event(const std::string& line) {
  const std::string stamp =
      absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone());
  std::cout << "\r\033[K[" << stamp << "] " << line << std::endl;
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
  std::ofstream(out) << EmbeddedConfig(daemon, options.task);
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
    if (!WarmStart()) return 1;
    if (!PrepareTask()) return 1;
    rl_start_ = absl::Now();
    if (!StartCoordinator()) {
      supervisor_.StopAll(absl::Seconds(5));
      return 1;
    }
    StartMember("trainer", "trainer");
    StartMember("verifier", "verifier");
    if (options_.task == "tools" && !WaitForVerifier()) {
      supervisor_.StopAll(absl::Seconds(5));
      return 1;
    }
    for (int i = 0; i < options_.rollout_workers; ++i) {
      StartMember("rollout", absl::StrCat("rollout-", i));
    }
    const int signal_number = Supervise();
    Event(signal_number > 0
              ? absl::StrCat("received ", strsignal(signal_number),
                             "; stopping the cluster")
              : "duration reached; stopping the cluster");
    std::optional<ProgressSnapshot> last = Collect();
    RunSummary summary;
    summary.rl_time = absl::Now() - rl_start_;
    summary.warm_start_time = warm_start_time_;
    const bool clean = supervisor_.StopAll(
        absl::Milliseconds(options_.drain_timeout_ms) + absl::Seconds(5));
    Event(clean ? "all daemons exited cleanly"
                : "some daemons did not exit cleanly (see logs)");
    if (last.has_value()) {
      for (const auto& [name, tokens] : generated_tokens_) {
        summary.generated_tokens += tokens;
      }
      const fs::path checkpoints = fs::path(options_.run_dir) / "checkpoints";
      std::error_code ec;
      const fs::path latest = fs::canonical(checkpoints / "latest", ec);
      if (!ec) {
        summary.checkpoint_path = latest.string();
        if (fs::exists(latest / "hf")) {
          summary.export_path = (latest / "hf").string();
        }
      }
      std::cout << FormatRunSummary(*last, summary) << std::flush;
    }
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
    if (UsesEmbedded(daemon) && options_.task == "tools") {
      if (daemon == "coordinator") {
        argv.push_back("--set");
        argv.push_back("dataset.path=" + tools_dataset_path_);
        argv.push_back("--set");
        argv.push_back("dataset.tokenizer=" +
                       (fs::path(model_path_) / "tokenizer.json").string());
      } else if (daemon == "rollout") {
        argv.push_back("--set");
        argv.push_back("environment.address=" + verifier_address_);
      }
    }
    if ((daemon == "trainer" || daemon == "rollout") && !model_path_.empty()) {
      argv.push_back("--set");
      argv.push_back("model.path=" + model_path_);
    }
    if (daemon == "trainer" &&
        (options_.config_dir.empty() ||
         !fs::exists(fs::path(options_.config_dir) / "trainer.yaml"))) {
      argv.push_back("--set");
      argv.push_back("checkpoint_dir=" +
                     (fs::path(options_.run_dir) / "checkpoints").string());
    }
    return argv;
  }

  // Whether `daemon` runs the embedded config (no user file replaces it).
  bool UsesEmbedded(const std::string& daemon) const {
    return options_.config_dir.empty() ||
           !fs::exists(fs::path(options_.config_dir) / (daemon + ".yaml"));
  }

  // --task tools: its dataset, which names the calculator environment.
  bool PrepareTask() {
    if (options_.task != "tools") return true;
    if (model_path_.empty()) {
      Event(
          "--task tools needs the warm start's model (its tokenizer and "
          "chat template): run with --warm-start on, or give --model");
      return false;
    }
    tools_dataset_path_ =
        (fs::path(options_.run_dir) / "tools_train.jsonl").string();
    if (absl::Status s =
            WriteToolsDataset(tools_dataset_path_, kToolsDatasetRows, 0);
        !s.ok()) {
      Event(std::string(s.message()));
      return false;
    }
    Event(absl::StrCat("tools task: ", kToolsDatasetRows, " train problems (",
                       kToolsDigits, "-digit products) in ",
                       tools_dataset_path_));
    return true;
  }

  // The rollout workers of --task tools need the verifier's address (its
  // gRPC port also serves tandem.v1.Environment).
  bool WaitForVerifier() {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up) {
      auto ready = ReadReadyFile(ReadyPath("verifier"));
      if (!ready.empty()) {
        verifier_address_ = ready["grpc_address"];
        Event(absl::StrCat("verifier (calculator environment) serving on ",
                           verifier_address_));
        return true;
      }
      supervisor_.Poll();
      absl::SleepFor(absl::Milliseconds(50));
    }
    Event(absl::StrCat("verifier did not become ready within 30s; see ",
                       LogPath("verifier")));
    return false;
  }

  bool WarmStartEnabled() const {
    if (options_.warm_start == "on") return true;
    if (options_.warm_start == "off") return false;
    return options_.config_dir.empty();
  }

  // Runs (or finds cached) the supervised warm start; its checkpoint becomes
  // the trainer's and the rollout workers' model.path.
  bool WarmStart() {
    if (!options_.model.empty()) {
      model_path_ = fs::absolute(options_.model).string();
      Event(absl::StrCat("model ", model_path_, " (--model; no warm start)"));
      return true;
    }
    if (!WarmStartEnabled()) return true;
    WarmStartOptions warm;
    warm.trainer_binary = Binary("trainer");
    const bool tools = options_.task == "tools";
    warm.output_dir = (fs::path(options_.cache_dir) / "warm-start" /
                       (tools ? absl::StrCat("tools", kToolsDigits)
                              : std::string("arith3-add")))
                          .string();
    warm.log_path = LogPath("warm-start");
    warm.sft_flags = tools ? ToolsWarmStartFlags() : WarmStartFlags();
    Event(absl::StrCat("warm start: supervised training of the built-in ",
                       "model on ",
                       tools ? absl::StrCat(kToolsDigits,
                                            "-digit products with the "
                                            "calculator tool")
                             : std::string("3-digit addition"),
                       " (cached in ", warm.output_dir, ")"));
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> model = RunWarmStart(
        warm, [](const std::string& line) { Event("warm start: " + line); });
    warm_start_time_ = absl::Now() - start;
    if (!model.ok()) {
      Event(std::string(model.status().message()));
      return false;
    }
    model_path_ = *model;
    return true;
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
        coordinator_ =
            cluster::ConnectCoordinator(coordinator_address_, options_.tls);
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

  // Status of the coordinator, the trainer and the rollout workers; empty
  // when the coordinator does not answer.
  std::optional<ProgressSnapshot> Collect() {
    ProgressSnapshot snapshot;
    snapshot.taken = absl::Now();
    {
      grpc::ClientContext context;
      context.set_deadline(
          absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
      grpc::Status rpc = coordinator_->GetClusterStatus(
          &context, tandem::v1::GetClusterStatusRequest(), &snapshot.cluster);
      if (!rpc.ok()) {
        last_error_ = rpc.error_message();
        return std::nullopt;
      }
    }
    for (const auto& m : snapshot.cluster.members()) {
      if (m.state() != tandem::v1::MEMBER_STATE_ALIVE) continue;
      if (m.role() == tandem::v1::ROLE_TRAINER) {
        tandem::v1::TrainerStatus trainer;
        grpc::ClientContext context;
        context.set_deadline(
            absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
        auto stub = tandem::v1::Trainer::NewStub(Channel(m.grpc_address()));
        if (stub->GetStatus(&context, tandem::v1::GetTrainerStatusRequest(),
                            &trainer)
                .ok()) {
          snapshot.trainer = trainer;
        }
      } else if (m.role() == tandem::v1::ROLE_ROLLOUT) {
        tandem::v1::RolloutStatus rollout;
        grpc::ClientContext context;
        context.set_deadline(
            absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
        auto stub =
            tandem::v1::RolloutWorker::NewStub(Channel(m.grpc_address()));
        if (stub->GetStatus(&context, tandem::v1::GetRolloutStatusRequest(),
                            &rollout)
                .ok()) {
          uint64_t& seen = generated_tokens_[m.member_id()];
          seen = std::max(seen, rollout.generated_tokens_total());
          snapshot.rollouts.push_back(std::move(rollout));
        }
      }
    }
    return snapshot;
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
    auto& channel = channels_[address];
    if (channel == nullptr) channel = rpc::MakeChannel(address, options_.tls);
    return channel;
  }

  void ShowStatus(bool final_table) {
    std::optional<ProgressSnapshot> snapshot = Collect();
    const std::string line =
        snapshot.has_value()
            ? FormatProgressLine(*snapshot)
            : absl::StrCat("coordinator unreachable: ", last_error_);
    if (final_table && snapshot.has_value()) {
      std::cout << "\r\033[K"
                << cluster::FormatClusterStatus(snapshot->cluster,
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
  std::unique_ptr<cluster::CoordinatorClient> coordinator_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
  std::map<std::string, uint64_t> generated_tokens_;
  std::string last_error_;
  std::string model_path_;
  std::string tools_dataset_path_;
  std::string verifier_address_;
  absl::Duration warm_start_time_;
  absl::Time rl_start_;
};

}  // namespace
}  // namespace tandem::launcher

int main(int argc, char** argv) {
  using tandem::launcher::Options;
  Options options;
  options.bin_dir = tandem::ExecutableDir();
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
  app.add_option("--warm-start", options.warm_start,
                 "Supervised warm start of the built-in model before RL "
                 "(cached): auto = on unless --config-dir is given")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--cache-dir", options.cache_dir,
                 "Where the warm start is cached (default "
                 "$TANDEM_CACHE_DIR, $XDG_CACHE_HOME/tandem or "
                 "~/.cache/tandem)");
  app.add_option("--task", options.task,
                 "Built-in task: arith (3-digit addition) or tools "
                 "(4-digit products, solved by calling the calculator "
                 "environment)")
      ->check(CLI::IsMember({"arith", "tools"}))
      ->capture_default_str();
  app.add_option("--model", options.model,
                 "Hugging Face model directory for the trainer and the "
                 "rollout workers, instead of the warm start's");
  tandem::config::TlsFlags tls_flags;
  tls_flags.AddTo(&app);
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<tandem::rpc::TlsOptions> tls = tls_flags.Resolve();
  if (!tls.ok()) {
    std::cerr << "tandem-local: " << tls.status().message() << "\n";
    return 2;
  }
  options.tls = *tls;
  if (options.cache_dir.empty()) {
    options.cache_dir = tandem::launcher::DefaultCacheRoot();
  }
  options.cache_dir = std::filesystem::absolute(options.cache_dir).string();
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
