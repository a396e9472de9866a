// Weight transport throughput against a plain TCP socket copy of the same
// bytes between two processes, all in one run (issue 5 benchmarks).
//
//   weights_transport_bench [--runs=N] [--receivers=1,2,3] [MiB...]
//       (defaults: 1 run, receivers 1,2,3, sizes 64 256 1024)
//
// This process is the sender in every row; every receiver is a separate
// process (this binary re-executed in a child mode), so sender and
// receivers never share an address space or a scheduler thread pool.
//
// Rows, each timed in the sender from "go" until every receiver reported
// that the bytes are in its buffer (for the weight transports: staged,
// every bucket CRC-32C verified, committed):
//   socket  raw write()/read() of the buffer over loopback TCP into a
//           pre-faulted buffer, 1 receiver: the baseline.
//   pull    catch-up pull (GrpcPullReceiver from a WeightServerService)
//           into a double-buffered StagingWeights, 1 receiver: over the
//           FetchWeights gRPC stream, and over the raw data path.
//   gloo k  c10d ProcessGroupGloo broadcast (GlooWeightSender /
//           GlooWeightReceiver) into StagingWeights, k receivers.
// Ratios are (socket seconds) / (row seconds): the throughput of the row as
// a fraction of the socket copy measured in the same run. Buckets are
// 64 MiB. Every receiver first receives two untimed versions (connections,
// both staging buffers touched), then three timed ones; each row reports
// the fastest of the three (the machines are shared: the minimum is the
// least disturbed), the same rule for every row.
//
// Memory: the sender holds the payload (S bytes); each receiver holds two
// staging buffers (2 S). At 1 GiB with 3 receivers that is 7 GiB.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/weights/gloo_broadcast_transport.h"
#include "common/weights/grpc_pull_receiver.h"
#include "common/weights/weight_server.h"
#include "common/weights/weight_store.h"
#include "kernels/crc32c.h"

namespace tandem::weights {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kBucketBytes = 64ull << 20;
constexpr int kWarmupVersions = 2;
constexpr int kTimedVersions = 3;  // the row reports the fastest

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "weights_transport_bench[%d]: %s\n", getpid(),
               what.c_str());
  std::exit(1);
}

FlatWeightLayout MakeLayout(uint64_t bytes) {
  auto layout = FlatWeightLayout::Create(
      {{"w", v1::DTYPE_BF16, {static_cast<int64_t>(bytes / 2)}, bytes}},
      {.bucket_bytes = kBucketBytes, .alignment = 64});
  if (!layout.ok()) Die(layout.status().ToString());
  return *std::move(layout);
}

// ---- Child side: line protocol on stdin (from the sender) and stdout ----

std::string ReadLine(FILE* in) {
  std::string line;
  for (int c = std::fgetc(in); c != EOF && c != '\n'; c = std::fgetc(in)) {
    line.push_back(static_cast<char>(c));
  }
  return line;
}

void Say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

void WaitFor(const std::string& word) {
  const std::string line = ReadLine(stdin);
  if (line != word)
    Die(absl::StrCat("expected '", word, "', got '", line, "'"));
}

int ConnectLoopback(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Die(absl::StrCat("connect to port ", port, ": ", std::strerror(errno)));
  }
  return fd;
}

// Reads `bytes` from the sender into a pre-faulted buffer, once per round.
void ChildSocket(uint16_t port, uint64_t bytes, int rounds) {
  std::vector<uint8_t> dst(bytes, 0);
  int fd = ConnectLoopback(port);
  for (int r = 0; r < rounds; ++r) {
    size_t got = 0;
    while (got < dst.size()) {
      ssize_t n = read(fd, dst.data() + got, dst.size() - got);
      if (n <= 0) Die("socket read failed");
      got += static_cast<size_t>(n);
    }
    const char done = 'D';
    if (write(fd, &done, 1) != 1) Die("socket ack failed");
  }
  close(fd);
  Say(absl::StrCat("crc ", kernels::Crc32c(dst.data(), dst.size())));
}

void ChildPull(uint16_t port, uint64_t bytes, int rounds, bool raw) {
  auto staging =
      StagingWeights::Create(MakeLayout(bytes), StagingMode::kDoubleBuffer);
  if (!staging.ok()) Die(staging.status().ToString());
  GrpcPullReceiver receiver(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                          grpc::InsecureChannelCredentials()),
      {.raw_data = raw});
  Say("ready");
  for (int r = 0; r < rounds; ++r) {
    WaitFor("go");
    auto got =
        receiver.ReceiveNext(staging->get(), absl::Now() + absl::Seconds(600));
    if (!got.ok()) Die(got.status().ToString());
    if (!(*staging)->Commit().ok()) Die("commit");
    Say(absl::StrCat("done ", *got));
  }
  const PullStats stats = receiver.stats();
  if ((raw ? stats.raw_streams : stats.grpc_streams) == 0) {
    Die(absl::StrCat("pull did not use the ", raw ? "raw" : "gRPC", " path"));
  }
}

void ChildGloo(uint16_t port, uint64_t bytes, int rank, int world, int rounds) {
  auto staging =
      StagingWeights::Create(MakeLayout(bytes), StagingMode::kDoubleBuffer);
  if (!staging.ok()) Die(staging.status().ToString());
  GlooGroupConfig c;
  c.store_port = port;
  c.rank = rank;
  c.world_size = world;
  c.key_prefix = "bench";
  c.timeout = absl::Seconds(300);
  auto group = GlooBroadcastGroup::Create(c);
  if (!group.ok()) Die(group.status().ToString());
  GlooWeightReceiver receiver(group->get());
  for (int r = 0; r < rounds; ++r) {
    auto got = receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
    if (!got.ok()) Die(got.status().ToString());
    if (!(*staging)->Commit().ok()) Die("commit");
    Say(absl::StrCat("done ", *got));
  }
}

// ---- Sender side ----

struct Child {
  pid_t pid = -1;
  FILE* to = nullptr;    // child's stdin
  FILE* from = nullptr;  // child's stdout
};

Child Spawn(const std::vector<std::string>& args) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) Die("pipe");
  pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    std::vector<char*> argv;
    static std::string self = "/proc/self/exe";
    argv.push_back(self.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  return {pid, fdopen(in[1], "w"), fdopen(out[0], "r")};
}

std::string Expect(Child& c, const std::string& prefix) {
  const std::string line = ReadLine(c.from);
  if (line.rfind(prefix, 0) != 0) {
    Die(absl::StrCat("child ", c.pid, ": expected '", prefix, "', got '", line,
                     "'"));
  }
  return line.substr(prefix.size());
}

void Tell(Child& c, const std::string& line) {
  std::fputs((line + "\n").c_str(), c.to);
  std::fflush(c.to);
}

void Reap(Child& c) {
  std::fclose(c.to);
  std::fclose(c.from);
  int status = 0;
  waitpid(c.pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die(absl::StrCat("child ", c.pid, " failed (status ", status, ")"));
  }
}

double SocketSeconds(const std::vector<uint8_t>& src) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Die("socket setup failed");
  }
  const int rounds = kWarmupVersions + kTimedVersions;
  Child child =
      Spawn({"--child=socket", absl::StrCat("--port=", ntohs(addr.sin_port)),
             absl::StrCat("--bytes=", src.size()),
             absl::StrCat("--rounds=", rounds)});
  int fd = accept(listener, nullptr, nullptr);
  double seconds = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    size_t sent = 0;
    while (sent < src.size()) {
      ssize_t n = write(fd, src.data() + sent,
                        std::min<size_t>(1 << 20, src.size() - sent));
      if (n <= 0) Die("socket write failed");
      sent += static_cast<size_t>(n);
    }
    char ack = 0;
    if (read(fd, &ack, 1) != 1 || ack != 'D') Die("socket ack missing");
    if (r >= kWarmupVersions) seconds = std::min(seconds, Since(start));
  }
  close(fd);
  close(listener);
  const std::string crc = Expect(child, "crc ");
  if (crc != absl::StrCat(kernels::Crc32c(src.data(), src.size()))) {
    Die("socket copy mismatch");
  }
  Reap(child);
  return seconds;
}

v1::WeightManifest WithVersion(const v1::WeightManifest& m, uint64_t v) {
  v1::WeightManifest out = m;
  out.set_policy_version(v);
  return out;
}

double PullSeconds(const v1::WeightManifest& manifest,
                   std::shared_ptr<const std::vector<uint8_t>> payload,
                   bool raw) {
  WeightStore store(2);
  WeightServerService service(&store, {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  const int rounds = kWarmupVersions + kTimedVersions;
  Child child = Spawn({"--child=pull", absl::StrCat("--port=", port),
                       absl::StrCat("--bytes=", payload->size()),
                       absl::StrCat("--rounds=", rounds),
                       absl::StrCat("--raw=", raw ? 1 : 0)});
  Expect(child, "ready");
  double seconds = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const uint64_t version = r + 1;
    if (!store.Put(WithVersion(manifest, version), payload).ok()) {
      Die("store put");
    }
    const auto start = Clock::now();
    Tell(child, "go");
    const std::string got = Expect(child, "done ");
    if (r >= kWarmupVersions) seconds = std::min(seconds, Since(start));
    if (got != absl::StrCat(version)) Die("pull: wrong version " + got);
  }
  Reap(child);
  server->Shutdown();
  return seconds;
}

double GlooSeconds(const v1::WeightManifest& manifest,
                   const std::vector<uint8_t>& payload, int receivers) {
  auto store = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(60));
  if (!store.ok()) Die(store.status().ToString());
  const int rounds = kWarmupVersions + kTimedVersions;
  std::vector<Child> children;
  for (int rank = 1; rank <= receivers; ++rank) {
    children.push_back(Spawn(
        {"--child=gloo", absl::StrCat("--port=", (*store)->port()),
         absl::StrCat("--bytes=", payload.size()),
         absl::StrCat("--rank=", rank), absl::StrCat("--world=", receivers + 1),
         absl::StrCat("--rounds=", rounds)}));
  }
  GlooGroupConfig c;
  c.store_port = (*store)->port();
  c.rank = 0;
  c.world_size = receivers + 1;
  c.key_prefix = "bench";
  c.timeout = absl::Seconds(300);
  auto group = GlooBroadcastGroup::Create(c, store->get());
  if (!group.ok()) Die(group.status().ToString());
  GlooWeightSender sender(group->get());
  double seconds = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const uint64_t version = r + 1;
    const auto start = Clock::now();
    if (absl::Status s = sender.Publish(WithVersion(manifest, version), payload,
                                        absl::InfiniteFuture());
        !s.ok()) {
      Die(s.ToString());
    }
    for (Child& child : children) {
      if (Expect(child, "done ") != absl::StrCat(version)) {
        Die("gloo: wrong version");
      }
    }
    if (r >= kWarmupVersions) seconds = std::min(seconds, Since(start));
  }
  for (Child& child : children) Reap(child);
  return seconds;
}

void Run(uint64_t mib, const std::vector<int>& receivers, int run) {
  const uint64_t bytes = mib << 20;
  FlatWeightLayout layout = MakeLayout(bytes);
  auto payload = std::make_shared<std::vector<uint8_t>>(bytes);
  std::mt19937_64 rng(run + 1);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t r = rng();
    std::memcpy(payload->data() + i, &r, 8);
  }
  auto manifest = layout.BuildManifest(*payload, 1);
  if (!manifest.ok()) Die(manifest.status().ToString());
  const double socket_s = SocketSeconds(*payload);
  const double grpc_s = PullSeconds(*manifest, payload, /*raw=*/false);
  const double raw_s = PullSeconds(*manifest, payload, /*raw=*/true);
  auto gbps = [&](double s) { return bytes / s / 1e9; };
  std::string row =
      absl::StrFormat("| %d MiB | %d | %.2f | %.2f (%.2f) | %.2f (%.2f) |", mib,
                      run, gbps(socket_s), gbps(grpc_s), socket_s / grpc_s,
                      gbps(raw_s), socket_s / raw_s);
  for (int k : receivers) {
    const double gloo_s = GlooSeconds(*manifest, *payload, k);
    absl::StrAppendFormat(&row, " %.2f (%.2f) |", gbps(gloo_s),
                          socket_s / gloo_s);
  }
  absl::PrintF("%s\n", row);
  std::fflush(stdout);
}

int ChildMain(int argc, char** argv) {
  std::string mode;
  uint64_t bytes = 0, port = 0;
  int rank = 0, world = 0, rounds = 0, raw = 1;
  for (int i = 1; i < argc; ++i) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    bool ok = true;
    if (kv.first == "--child") {
      mode = kv.second;
    } else if (kv.first == "--bytes") {
      ok = absl::SimpleAtoi(kv.second, &bytes);
    } else if (kv.first == "--port") {
      ok = absl::SimpleAtoi(kv.second, &port);
    } else if (kv.first == "--rank") {
      ok = absl::SimpleAtoi(kv.second, &rank);
    } else if (kv.first == "--world") {
      ok = absl::SimpleAtoi(kv.second, &world);
    } else if (kv.first == "--raw") {
      ok = absl::SimpleAtoi(kv.second, &raw);
    } else if (kv.first == "--rounds") {
      ok = absl::SimpleAtoi(kv.second, &rounds);
    } else {
      ok = false;
    }
    if (!ok) Die(absl::StrCat("bad child argument '", argv[i], "'"));
  }
  const auto p = static_cast<uint16_t>(port);
  if (mode == "socket") {
    ChildSocket(p, bytes, rounds);
  } else if (mode == "pull") {
    ChildPull(p, bytes, rounds, raw != 0);
  } else if (mode == "gloo") {
    ChildGloo(p, bytes, rank, world, rounds);
  } else {
    Die(absl::StrCat("unknown child mode '", mode, "'"));
  }
  return 0;
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) {
  using namespace tandem::weights;
  if (argc > 1 && std::strncmp(argv[1], "--child=", 8) == 0) {
    return ChildMain(argc, argv);
  }
  signal(SIGPIPE, SIG_IGN);
  std::vector<uint64_t> sizes;
  std::vector<int> receivers = {1, 2, 3};
  int runs = 1;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    uint64_t mib = 0;
    if (arg.substr(0, 7) == "--runs=") {
      if (!absl::SimpleAtoi(arg.substr(7), &runs) || runs < 1) {
        Die(absl::StrCat("--runs: bad value '", arg.substr(7), "'"));
      }
    } else if (arg.substr(0, 12) == "--receivers=") {
      receivers.clear();
      for (absl::string_view k : absl::StrSplit(arg.substr(12), ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(k, &n) || n < 1 || n > 3) {
          Die(absl::StrCat("--receivers: bad count '", k, "' (1..3)"));
        }
        receivers.push_back(n);
      }
    } else if (absl::SimpleAtoi(arg, &mib) && mib >= 1 && mib <= 1024) {
      sizes.push_back(mib);
    } else {
      Die(absl::StrCat("bad argument '", arg,
                       "': expected --runs=N, --receivers=1,2,3 or a size in "
                       "MiB (1..1024)"));
    }
  }
  if (sizes.empty()) sizes = {64, 256, 1024};
  std::string header =
      "| size | run | socket GB/s | pull gRPC GB/s (ratio) | pull raw GB/s "
      "(ratio) |";
  std::string rule = "| --- | --- | --- | --- | --- |";
  for (int k : receivers) {
    absl::StrAppend(&header, " gloo ", k, " receiver", k > 1 ? "s" : "",
                    " GB/s (ratio) |");
    absl::StrAppend(&rule, " --- |");
  }
  absl::PrintF("%s\n%s\n", header, rule);
  for (int run = 1; run <= runs; ++run) {
    for (uint64_t mib : sizes) Run(mib, receivers, run);
  }
  return 0;
}
