// Weight transport throughput against a plain TCP socket copy of the same
// bytes between two processes, all in one run (issue 5 benchmarks).
//
//   weights_transport_bench [--rounds=N] [--serial] [--piece-kib=K]
//                           [--receivers=1,2,3] [--columns=C,...]
//                           [--socket-read-kib=K] [MiB...]
//       (defaults: 7 rounds, receivers 1,2,3, sizes 64 256 1024, every
//       column; --columns picks some of grpc, raw, raw-secret, shm,
//       shm-publish, shm-made, gloo, gloo-sealed; the baseline's receiver asks each read() for all
//       that is missing, or for at most K KiB with --socket-read-kib=K)
//
// This process is the sender in every row; every receiver is a separate
// process (this binary re-executed in a child mode), so sender and
// receivers never share an address space or a scheduler thread pool.
//
// Transfers, each timed in the sender from "go" until every receiver
// reported that the bytes are in its buffer (for the weight transports:
// staged, every bucket CRC-32C verified, committed):
//   socket  raw write()/read() of the buffer over loopback TCP into a
//           pre-faulted buffer, 1 receiver: the baseline. Each read() asks
//           for all the bytes still missing (or K KiB, --socket-read-kib).
//   pull    catch-up pull (GrpcPullReceiver from a WeightServerService)
//           into a double-buffered StagingWeights, 1 receiver: over the
//           FetchWeights gRPC stream, over the raw data path, and through
//           the same-host shared-memory path, where the receiver maps a
//           /dev/shm segment holding the version and copies it into
//           staging. Who makes the segment (one copy of the payload):
//             pull shm, made on request: the server, on the first request
//               for the version (WeightStore kOnRequest; timed: with one
//               receiver nothing amortizes it);
//             pull shm, made at publish: the store's Put, as the trainer
//               publishes (kAtPut, weight_sync.shared_memory); the clock
//               starts before the Put, so the copy is timed;
//             pull shm, segment made: kAtPut with the clock started after
//               the Put: what a worker waits for once the version is
//               announced (and every worker after the first, either way).
//             pull raw, epoch secret: the raw data path with a data-plane
//               key on both ends (tls.mode mtls): every connection first
//               answers the server's challenge (data_plane_auth.h),
//               and the stream after it is sealed (AES-256-GCM records,
//               weight_server.h, "Raw data path confidentiality");
//   gloo k  c10d ProcessGroupGloo broadcast (GlooWeightSender /
//           GlooWeightReceiver) into StagingWeights, k receivers; a
//           receiver checksums each bucket (or piece, --piece-kib=K: the
//           sender's BroadcastGroupConfig.piece_bytes, whole buckets by
//           default) while the next one arrives.
//   gloo 1, sealed (--columns=gloo-sealed): the same, 1 receiver, with a
//           data-plane key on both ends (tls.mode mtls): every version is
//           sealed by the sender and opened by the receiver before its
//           checksums (broadcast_protocol.h, "Sealed");
//   gloo 1, serial checksums (--serial): the same with 1 receiver, whole
//           64 MiB buckets, each checksummed before the next is asked for:
//           the transport as it was before the overlap.
// Each transfer under test runs paired with its own socket copy: after two
// untimed versions of each, N rounds alternate the two (socket first in
// even rounds, last in odd ones), and each round gives the ratio (socket
// seconds) / (transfer seconds) of two transfers made moments apart. A
// cell reports the median of those ratios with their range, and the
// transfer's median throughput. On shared, noisy cores the per-round
// pairing cancels load changes that a "fastest of N" per column does not.
// Buckets are 64 MiB.
//
// Memory: the sender holds the payload (S bytes); each receiver holds two
// staging buffers (2 S); the pull shm columns add one segment (S) in
// /dev/shm. At 1 GiB with 3 receivers that is 7 GiB.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "kernels/crc32c.h"
#include "tests/unit/weight_server_test_util.h"
#include "tests/bench/bench_util.h"

namespace tandem::weights {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kBucketBytes = 64ull << 20;
constexpr int kWarmupVersions = 2;

// Gloo's BroadcastGroupConfig.piece_bytes in the non-serial columns.
uint64_t g_piece_bytes = BroadcastGroupConfig{}.piece_bytes;

// The columns --columns picked (empty: all), by kPullColumns' names and
// "gloo" for every broadcast column.
std::set<std::string> g_columns;

bool Picked(const std::string& name) {
  return g_columns.empty() || g_columns.count(name) > 0;
}

// The baseline receiver's read() size (--socket-read-kib; 0: unbounded).
uint64_t g_socket_read_bytes = 0;

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

// Reads `bytes` from the sender into a pre-faulted buffer, once per round,
// until the sender closes the connection; at most `read_bytes` per read()
// (0: all that is missing).
void ChildSocket(uint16_t port, uint64_t bytes, uint64_t read_bytes) {
  std::vector<uint8_t> dst(bytes, 0);
  int fd = ConnectLoopback(port);
  for (;;) {
    size_t got = 0;
    while (got < dst.size()) {
      const size_t want = read_bytes == 0
                              ? dst.size() - got
                              : std::min<size_t>(read_bytes, dst.size() - got);
      ssize_t n = read(fd, dst.data() + got, want);
      if (n == 0 && got == 0) {  // the sender is done
        close(fd);
        Say(absl::StrCat("crc ", kernels::Crc32c(dst.data(), dst.size())));
        return;
      }
      if (n <= 0) Die("socket read failed");
      got += static_cast<size_t>(n);
    }
    const char done = 'D';
    if (write(fd, &done, 1) != 1) Die("socket ack failed");
  }
}

// Pulls a version on every "go" line, until stdin closes.
void ChildPull(uint16_t port, uint64_t bytes, bool raw, bool shm,
               const std::string& secret) {
  auto staging =
      StagingWeights::Create(MakeLayout(bytes), StagingMode::kDoubleBuffer);
  if (!staging.ok()) Die(staging.status().ToString());
  std::shared_ptr<DataPlaneKeyHolder> key;
  if (!secret.empty()) {
    auto parsed = DataPlaneKeyFromBytes(
        1, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(secret.data()),
                               secret.size()));
    if (!parsed.ok()) Die(parsed.status().ToString());
    key = std::make_shared<DataPlaneKeyHolder>();
    key->Set(*parsed);
  }
  GrpcPullReceiver receiver(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                          grpc::InsecureChannelCredentials()),
      {.raw_data = raw, .shared_memory = shm, .data_plane_key = key});
  Say("ready");
  for (std::string line = ReadLine(stdin); line == "go";
       line = ReadLine(stdin)) {
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
  if (stats.raw_auth_fallbacks != 0) {
    Die("pull fell back from the raw path: the data-plane proof was refused");
  }
  if (shm != (stats.shm_versions > 0)) {
    Die(absl::StrCat("pull ", shm ? "did not use" : "used",
                     " the shared-memory path"));
  }
}

// A group that checksums each bucket only after it arrived and before the
// next one is requested: the receiver as it was before pieces overlapped
// (StartBroadcast's default), kept as the in-run baseline of the overlap.
class SerialGroup : public BroadcastGroup {
 public:
  explicit SerialGroup(BroadcastGroup* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  bool broken() const override { return inner_->broken(); }
  absl::Status Broadcast(absl::Span<uint8_t> bytes) override {
    return inner_->Broadcast(bytes);
  }
  void Abort() override { inner_->Abort(); }

 private:
  BroadcastGroup* inner_;
};

// Receives broadcast versions until a round of version 0.
void ChildGloo(uint16_t port, uint64_t bytes, int rank, int world,
               bool serial, const std::string& secret) {
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
  SerialGroup serial_group(group->get());
  GlooWeightReceiver receiver(serial ? &serial_group
                                     : static_cast<BroadcastGroup*>(group->get()));
  DataPlaneKeyHolder keys;
  if (!secret.empty()) {
    auto parsed = DataPlaneKeyFromBytes(
        1, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(secret.data()),
                               secret.size()));
    if (!parsed.ok()) Die(parsed.status().ToString());
    keys.Set(*parsed);
    receiver.set_data_plane_keys(&keys);
  }
  for (;;) {
    auto got = receiver.ReceiveNext(staging->get(), absl::InfiniteFuture());
    if (receiver.last_round_version() == 0) return;  // the stop round
    if (!got.ok()) Die(got.status().ToString());
    if (!(*staging)->Commit().ok()) Die("commit");
    if (!secret.empty() && !receiver.last_seal().sealed) Die("not sealed");
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

// One transfer under test, set up once per row: Round() moves a new version
// of the payload to every receiver and returns the seconds it took.
class Column {
 public:
  virtual ~Column() = default;
  virtual double Round() = 0;
};

// The baseline: write()/read() of the bytes over loopback TCP.
class SocketColumn : public Column {
 public:
  explicit SocketColumn(const std::vector<uint8_t>& src) : src_(src) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(listener_, 1) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) !=
            0) {
      Die("socket setup failed");
    }
    child_ =
        Spawn({"--child=socket", absl::StrCat("--port=", ntohs(addr.sin_port)),
               absl::StrCat("--bytes=", src.size()),
               absl::StrCat("--read=", g_socket_read_bytes)});
    fd_ = accept(listener_, nullptr, nullptr);
    if (fd_ < 0) Die("socket accept failed");
  }
  ~SocketColumn() override {
    close(fd_);
    close(listener_);
    const std::string crc = Expect(child_, "crc ");
    if (crc != absl::StrCat(kernels::Crc32c(src_.data(), src_.size()))) {
      Die("socket copy mismatch");
    }
    Reap(child_);
  }
  double Round() override {
    const auto start = Clock::now();
    size_t sent = 0;
    while (sent < src_.size()) {
      ssize_t n = write(fd_, src_.data() + sent,
                        std::min<size_t>(1 << 20, src_.size() - sent));
      if (n <= 0) Die("socket write failed");
      sent += static_cast<size_t>(n);
    }
    char ack = 0;
    if (read(fd_, &ack, 1) != 1 || ack != 'D') Die("socket ack missing");
    return Since(start);
  }

 private:
  const std::vector<uint8_t>& src_;
  int listener_ = -1;
  int fd_ = -1;
  Child child_;
};

v1::WeightManifest WithVersion(const v1::WeightManifest& m, uint64_t v) {
  v1::WeightManifest out = m;
  out.set_policy_version(v);
  return out;
}

// How a PullColumn uses shared memory (see the header).
enum class ShmColumn { kOff, kOnRequest, kAtPublish, kMade };

// The pull columns in table order, with their --columns names.
struct PullSpec {
  const char* name;
  const char* header;
  bool raw;
  ShmColumn shm;
  bool secret = false;  // a data-plane key on both ends
};
constexpr PullSpec kPullColumns[] = {
    {"grpc", "pull gRPC", false, ShmColumn::kOff},
    {"raw", "pull raw", true, ShmColumn::kOff},
    {"raw-secret", "pull raw, epoch secret", true, ShmColumn::kOff, true},
    {"shm", "pull shm, made on request", true, ShmColumn::kOnRequest},
    {"shm-publish", "pull shm, made at publish", true, ShmColumn::kAtPublish},
    {"shm-made", "pull shm, segment made", true, ShmColumn::kMade},
};

// Catch-up pull from a WeightServerService, 1 receiver; with `shm` not
// kOff: through shared memory (the store keeps one version, so one
// segment).
class PullColumn : public Column {
 public:
  PullColumn(const v1::WeightManifest& manifest,
             std::shared_ptr<const std::vector<uint8_t>> payload, bool raw,
             ShmColumn shm_mode = ShmColumn::kOff, bool secret = false)
      : manifest_(manifest),
        payload_(std::move(payload)),
        shm_mode_(shm_mode),
        store_(shm_mode == ShmColumn::kOff ? 2 : 1,
               shm_mode == ShmColumn::kOff || shm_mode == ShmColumn::kOnRequest
                   ? WeightStore::SharedMemory::kOnRequest
                   : WeightStore::SharedMemory::kAtPut),
        key_(secret ? NewKey() : nullptr),
        server_(&store_, {.shared_memory = shm_mode != ShmColumn::kOff,
                          .data_plane_key = key_}) {
    const bool shm = shm_mode != ShmColumn::kOff;
    std::string hex;
    if (key_ != nullptr) {
      const auto secret_bytes = key_->Get()->secret;
      hex = absl::BytesToHexString(absl::string_view(
          reinterpret_cast<const char*>(secret_bytes.data()),
          secret_bytes.size()));
    }
    child_ = Spawn({"--child=pull", absl::StrCat("--port=", server_.port()),
                    absl::StrCat("--bytes=", payload_->size()),
                    absl::StrCat("--raw=", raw ? 1 : 0),
                    absl::StrCat("--shm=", shm ? 1 : 0),
                    absl::StrCat("--secret=", hex)});
    Expect(child_, "ready");
  }
  ~PullColumn() override { Reap(child_); }
  double Round() override {
    const uint64_t version = ++version_;
    auto start = Clock::now();
    if (!store_.Put(WithVersion(manifest_, version), payload_).ok()) {
      Die("store put");
    }
    if (shm_mode_ == ShmColumn::kAtPublish || shm_mode_ == ShmColumn::kMade) {
      if (!store_.SharedFull(version).ok()) Die("no segment made at Put");
    }
    if (shm_mode_ != ShmColumn::kAtPublish) start = Clock::now();
    Tell(child_, "go");
    const std::string got = Expect(child_, "done ");
    const double seconds = Since(start);
    if (got != absl::StrCat(version)) Die("pull: wrong version " + got);
    return seconds;
  }

 private:
  const v1::WeightManifest manifest_;
  const std::shared_ptr<const std::vector<uint8_t>> payload_;
  static std::shared_ptr<DataPlaneKeyHolder> NewKey() {
    auto key = NewDataPlaneKey(1);
    if (!key.ok()) Die(key.status().ToString());
    auto holder = std::make_shared<DataPlaneKeyHolder>();
    holder->Set(*key);
    return holder;
  }

  const ShmColumn shm_mode_;
  WeightStore store_;
  const std::shared_ptr<DataPlaneKeyHolder> key_;
  testing::WeightServerLoopback server_;
  Child child_;
  uint64_t version_ = 0;
};

// Gloo broadcast from this process (rank 0) to `receivers` children.
class GlooColumn : public Column {
 public:
  GlooColumn(const v1::WeightManifest& manifest,
             const std::vector<uint8_t>& payload, int receivers,
             bool serial = false, bool sealed = false)
      : manifest_(manifest), payload_(payload) {
    std::string hex;
    if (sealed) {
      auto key = NewDataPlaneKey(1);
      if (!key.ok()) Die(key.status().ToString());
      keys_.Set(*key);
      hex = absl::BytesToHexString(absl::string_view(
          reinterpret_cast<const char*>(key->secret.data()),
          key->secret.size()));
    }
    auto store =
        GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(60));
    if (!store.ok()) Die(store.status().ToString());
    store_ = *std::move(store);
    for (int rank = 1; rank <= receivers; ++rank) {
      children_.push_back(Spawn(
          {"--child=gloo", absl::StrCat("--port=", store_->port()),
           absl::StrCat("--bytes=", payload.size()),
           absl::StrCat("--rank=", rank),
           absl::StrCat("--world=", receivers + 1),
           absl::StrCat("--serial=", serial ? 1 : 0),
           absl::StrCat("--secret=", hex)}));
    }
    GlooGroupConfig c;
    c.store_port = store_->port();
    c.rank = 0;
    c.world_size = receivers + 1;
    c.key_prefix = "bench";
    c.timeout = absl::Seconds(300);
    // Whole buckets for the serial column; --piece-kib for the others.
    c.piece_bytes = serial ? 0 : g_piece_bytes;
    auto group = GlooBroadcastGroup::Create(c, store_.get());
    if (!group.ok()) Die(group.status().ToString());
    group_ = *std::move(group);
    sender_ = std::make_unique<GlooWeightSender>(
        group_.get(), sealed ? &keys_ : nullptr);
  }
  ~GlooColumn() override {
    // Version 0 tells the receivers to stop.
    if (!sender_->Publish(WithVersion(manifest_, 0), payload_,
                          absl::InfiniteFuture())
             .ok()) {
      Die("gloo: stop round failed");
    }
    for (Child& child : children_) Reap(child);
  }
  double Round() override {
    const uint64_t version = ++version_;
    const auto start = Clock::now();
    if (absl::Status s = sender_->Publish(WithVersion(manifest_, version),
                                          payload_, absl::InfiniteFuture());
        !s.ok()) {
      Die(s.ToString());
    }
    for (Child& child : children_) {
      if (Expect(child, "done ") != absl::StrCat(version)) {
        Die("gloo: wrong version");
      }
    }
    return Since(start);
  }

 private:
  const v1::WeightManifest manifest_;
  const std::vector<uint8_t>& payload_;
  DataPlaneKeyHolder keys_;  // sealed: the sender's key
  std::unique_ptr<GlooRendezvousStore> store_;
  std::vector<Child> children_;
  std::unique_ptr<GlooBroadcastGroup> group_;
  std::unique_ptr<GlooWeightSender> sender_;
  uint64_t version_ = 0;
};

struct Paired {
  std::vector<double> column_seconds;
  std::vector<double> ratios;  // socket seconds / column seconds, per round
};

using bench::Median;

// Runs `column` and a socket copy of the same bytes in alternating order,
// round after round: each round's ratio compares two transfers made moments
// apart, so a load change on the shared cores hits both.
Paired RunPaired(const std::vector<uint8_t>& payload, Column& column,
                 int rounds) {
  SocketColumn socket(payload);
  for (int r = 0; r < kWarmupVersions; ++r) {
    socket.Round();
    column.Round();
  }
  Paired out;
  for (int r = 0; r < rounds; ++r) {
    double socket_s = 0, column_s = 0;
    if (r % 2 == 0) {
      socket_s = socket.Round();
      column_s = column.Round();
    } else {
      column_s = column.Round();
      socket_s = socket.Round();
    }
    out.column_seconds.push_back(column_s);
    out.ratios.push_back(socket_s / column_s);
  }
  return out;
}

void Run(uint64_t mib, const std::vector<int>& receivers, int rounds,
         bool serial) {
  const uint64_t bytes = mib << 20;
  FlatWeightLayout layout = MakeLayout(bytes);
  auto payload = std::make_shared<std::vector<uint8_t>>(bytes);
  std::mt19937_64 rng(mib);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    // Random finite weights (receivers refuse Inf/NaN): bit 6 of every
    // 16-bit word's high byte clear, so no exponent is all ones.
    const uint64_t r = rng() & 0xBFBFBFBFBFBFBFBFull;
    std::memcpy(payload->data() + i, &r, 8);
  }
  auto manifest = layout.BuildManifest(*payload, 1);
  if (!manifest.ok()) Die(manifest.status().ToString());
  std::string row = absl::StrFormat("| %d MiB |", mib);
  auto cell = [&](Column& column) {
    const Paired p = RunPaired(*payload, column, rounds);
    const auto [lo, hi] = std::minmax_element(p.ratios.begin(), p.ratios.end());
    absl::StrAppendFormat(&row, " %.2f (%.2f–%.2f) %.2f GB/s |",
                          Median(p.ratios), *lo, *hi,
                          bytes / Median(p.column_seconds) / 1e9);
  };
  for (const PullSpec& spec : kPullColumns) {
    if (!Picked(spec.name)) continue;
    PullColumn pull(*manifest, payload, spec.raw, spec.shm, spec.secret);
    cell(pull);
  }
  for (int k : receivers) {
    GlooColumn gloo(*manifest, *payload, k);
    cell(gloo);
    if (k == 1 && serial) {
      GlooColumn gloo_serial(*manifest, *payload, 1, /*serial=*/true);
      cell(gloo_serial);
    }
  }
  if (Picked("gloo-sealed")) {
    GlooColumn gloo_sealed(*manifest, *payload, 1, /*serial=*/false,
                           /*sealed=*/true);
    cell(gloo_sealed);
  }
  absl::PrintF("%s\n", row);
  std::fflush(stdout);
}

int ChildMain(int argc, char** argv) {
  std::string mode, secret;
  uint64_t bytes = 0, port = 0, read_bytes = 0;
  int rank = 0, world = 0, raw = 1, serial = 0, shm = 0;
  for (int i = 1; i < argc; ++i) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    bool ok = true;
    if (kv.first == "--child") {
      mode = kv.second;
    } else if (kv.first == "--bytes") {
      ok = absl::SimpleAtoi(kv.second, &bytes);
    } else if (kv.first == "--read") {
      ok = absl::SimpleAtoi(kv.second, &read_bytes);
    } else if (kv.first == "--port") {
      ok = absl::SimpleAtoi(kv.second, &port);
    } else if (kv.first == "--rank") {
      ok = absl::SimpleAtoi(kv.second, &rank);
    } else if (kv.first == "--serial") {
      ok = absl::SimpleAtoi(kv.second, &serial);
    } else if (kv.first == "--world") {
      ok = absl::SimpleAtoi(kv.second, &world);
    } else if (kv.first == "--raw") {
      ok = absl::SimpleAtoi(kv.second, &raw);
    } else if (kv.first == "--shm") {
      ok = absl::SimpleAtoi(kv.second, &shm);
    } else if (kv.first == "--secret") {
      secret = absl::HexStringToBytes(kv.second);
    } else {
      ok = false;
    }
    if (!ok) Die(absl::StrCat("bad child argument '", argv[i], "'"));
  }
  const auto p = static_cast<uint16_t>(port);
  if (mode == "socket") {
    ChildSocket(p, bytes, read_bytes);
  } else if (mode == "pull") {
    ChildPull(p, bytes, raw != 0, shm != 0, secret);
  } else if (mode == "gloo") {
    ChildGloo(p, bytes, rank, world, serial != 0, secret);
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
  int rounds = 7;
  bool serial = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    uint64_t mib = 0;
    if (arg.substr(0, 9) == "--rounds=") {
      if (!absl::SimpleAtoi(arg.substr(9), &rounds) || rounds < 1) {
        Die(absl::StrCat("--rounds: bad value '", arg.substr(9), "'"));
      }
    } else if (arg == "--serial") {
      serial = true;
    } else if (arg.substr(0, 12) == "--piece-kib=") {
      uint64_t kib = 0;
      if (!absl::SimpleAtoi(arg.substr(12), &kib) || kib > (1u << 20)) {
        Die(absl::StrCat("--piece-kib: bad value '", arg.substr(12), "'"));
      }
      g_piece_bytes = kib << 10;
    } else if (arg.substr(0, 12) == "--receivers=") {
      receivers.clear();
      for (absl::string_view k : absl::StrSplit(arg.substr(12), ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(k, &n) || n < 1 || n > 3) {
          Die(absl::StrCat("--receivers: bad count '", k, "' (1..3)"));
        }
        receivers.push_back(n);
      }
    } else if (arg.substr(0, 18) == "--socket-read-kib=") {
      uint64_t kib = 0;
      if (!absl::SimpleAtoi(arg.substr(18), &kib) || kib > (1u << 20)) {
        Die(absl::StrCat("--socket-read-kib: bad value '", arg.substr(18),
                         "'"));
      }
      g_socket_read_bytes = kib << 10;
    } else if (arg.substr(0, 10) == "--columns=") {
      std::string known = "gloo, gloo-sealed";
      for (const PullSpec& spec : kPullColumns) {
        known = absl::StrCat(known, ", ", spec.name);
      }
      for (absl::string_view c : absl::StrSplit(arg.substr(10), ',')) {
        const bool pull =
            std::any_of(std::begin(kPullColumns), std::end(kPullColumns),
                        [&](const PullSpec& spec) { return c == spec.name; });
        if (!pull && c != "gloo" && c != "gloo-sealed") {
          Die(absl::StrCat("--columns: unknown column '", c, "' (", known,
                           ")"));
        }
        g_columns.insert(std::string(c));
      }
    } else if (absl::SimpleAtoi(arg, &mib) && mib >= 1 && mib <= 1024) {
      sizes.push_back(mib);
    } else {
      Die(absl::StrCat(
          "bad argument '", arg,
          "': expected --rounds=N, --serial, --piece-kib=K, --receivers=1,2,3, "
          "--columns=C,..., --socket-read-kib=K or a size in "
          "MiB (1..1024)"));
    }
  }
  if (sizes.empty()) sizes = {64, 256, 1024};
  std::string header = "| size |";
  std::string rule = "| --- |";
  for (const PullSpec& spec : kPullColumns) {
    if (!Picked(spec.name)) continue;
    absl::StrAppend(&header, " ", spec.header, " |");
    absl::StrAppend(&rule, " --- |");
  }
  if (!Picked("gloo")) receivers.clear();
  for (int k : receivers) {
    absl::StrAppend(&header, " gloo, ", k, " receiver", k > 1 ? "s" : "",
                    " |");
    absl::StrAppend(&rule, " --- |");
    if (k == 1 && serial) {
      absl::StrAppend(&header, " gloo, 1 receiver, serial checksums |");
      absl::StrAppend(&rule, " --- |");
    }
  }
  if (Picked("gloo-sealed")) {
    absl::StrAppend(&header, " gloo, 1 receiver, sealed |");
    absl::StrAppend(&rule, " --- |");
  }
  absl::PrintF(
      "Each cell: median of %d per-round ratios (socket-copy seconds / row "
      "seconds), (min-max), and the row's median GB/s. Socket copy reads: "
      "%s.\n%s\n%s\n",
      rounds,
      g_socket_read_bytes == 0
          ? std::string("all that is missing per read()")
          : absl::StrCat(g_socket_read_bytes >> 10, " KiB per read()"),
      header, rule);
  for (uint64_t mib : sizes) Run(mib, receivers, rounds, serial);
  return 0;
}
