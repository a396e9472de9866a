#pragma once

// Two processes on one GPU for the CUDA IPC tests and benchmark: this
// process is the worker; it starts a copy of its own program as the
// "trainer" (RunIpcTrainer, selected by kTrainerFlag), which serves
// versions 1..N of a bf16 payload of a given size from device memory
// (DeviceVersionRing + WeightServerService on a loopback port). The two
// talk through files in a scratch directory:
//   port              the trainer's gRPC port (written once it serves)
//   v<N>.published    version N is in the store and the ring; holds the
//                     CLOCK_MONOTONIC nanoseconds just before the Puts
//   v<N>.ack          the worker has version N live: publish the next
// The payload of version N is PayloadByte(N, i) for every byte i (finite
// bf16 values), so the worker checks what it got without a second copy.
// Nothing here is a fake: real gRPC, real cudaIpc* calls, two processes.

#include <cuda_runtime_api.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/cuda_ipc_device.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/tree_digest.h"
#include "common/weights/weight_buffer.h"
#include "common/weights/weight_store.h"

extern char** environ;

namespace tandem::weights::ipc_pair {

inline constexpr char kTrainerFlag[] = "--ipc-trainer";

inline uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<uint64_t>(ts.tv_nsec);
}

// Byte i of version v: splitmix64 of (v, i / 8), with bit 6 of every odd
// byte cleared so each bf16 value's exponent is below 0xFF (finite).
inline void FillPayload(uint64_t version, absl::Span<uint8_t> out) {
  for (uint64_t w = 0; w * 8 < out.size(); ++w) {
    uint64_t z = version * 0x9E3779B97F4A7C15ull + w + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (uint64_t k = 0; k < 8 && w * 8 + k < out.size(); ++k) {
      uint8_t b = static_cast<uint8_t>(z >> (8 * k));
      if (k % 2 == 1) b &= 0xBF;
      out[w * 8 + k] = b;
    }
  }
}

// bf16 tensors of 32 MiB (the last smaller) adding up to `bytes`, in
// buckets of 256 MiB.
inline FlatWeightLayout PairLayout(uint64_t bytes) {
  std::vector<TensorInfo> tensors;
  constexpr uint64_t kTensor = uint64_t{32} << 20;
  for (uint64_t at = 0, i = 0; at < bytes; at += kTensor, ++i) {
    const uint64_t n = std::min(kTensor, bytes - at);
    tensors.push_back({absl::StrCat("w", 1000 + i),
                       v1::DTYPE_BF16,
                       {static_cast<int64_t>(n / 2)},
                       n});
  }
  return FlatWeightLayout::Create(std::move(tensors), {}).value();
}

inline bool WaitForFile(const std::filesystem::path& path, int seconds) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

inline void WriteFileAtomically(const std::filesystem::path& path,
                                const std::string& text) {
  {
    std::ofstream out(path.string() + ".tmp");
    out << text;
  }
  std::filesystem::rename(path.string() + ".tmp", path);
}

// The trainer's process: argv = {prog, kTrainerFlag, dir, bytes, versions}.
// `layout_of` turns `bytes` into the layout served (PairLayout; a test may
// give a model's layout for some sentinel size). Returns the exit status.
inline int RunIpcTrainer(
    int argc, char** argv,
    const std::function<FlatWeightLayout(uint64_t)>& layout_of = PairLayout) {
  if (argc != 5) return 2;
  const std::filesystem::path dir = argv[2];
  const uint64_t bytes = std::stoull(argv[3]);
  const uint64_t versions = std::stoull(argv[4]);
  const FlatWeightLayout layout = layout_of(bytes);
  WeightStore store(2);
  DeviceVersionRing ring(2);
  WeightServerService service(&store, {.data_host = "", .cuda_ipc = &ring});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return 3;
  WriteFileAtomically(dir / "port", std::to_string(port));
  for (uint64_t v = 1; v <= versions; ++v) {
    auto host = std::make_shared<std::vector<uint8_t>>(layout.total_bytes());
    FillPayload(v, absl::MakeSpan(*host));
    auto manifest = layout.BuildManifest(*host, v);
    // A tree root, as a GPU trainer sends by default
    // (weight_sync.tree_digest auto): workers check it on the device.
    if (manifest.ok()) {
      auto tree = WeightTreeSha256(*host);
      if (!tree.ok()) manifest = tree.status();
      if (manifest.ok()) manifest->set_tree_sha256(*std::move(tree));
    }
    auto buffer = AllocateDeviceWeightBuffer(0, v, layout.total_bytes(),
                                             ring.deferred_frees());
    if (!manifest.ok() || !buffer.ok()) {
      std::fprintf(stderr, "ipc trainer: %s %s\n",
                   manifest.status().ToString().c_str(),
                   buffer.status().ToString().c_str());
      return 4;
    }
    if (cudaMemcpy((*buffer)->payload, host->data(), host->size(),
                   cudaMemcpyHostToDevice) != cudaSuccess) {
      return 5;
    }
    const uint64_t published = MonotonicNs();
    ring.Put(*std::move(buffer));
    if (!store.Put(*manifest, host).ok()) return 6;
    WriteFileAtomically(dir / absl::StrCat("v", v, ".published"),
                        std::to_string(published));
    if (!WaitForFile(dir / absl::StrCat("v", v, ".ack"), 600)) return 7;
  }
  service.Shutdown();
  server->Shutdown();
  return 0;
}

// Starts the trainer's process (this program with kTrainerFlag) and waits
// for its port; stops it (waits for its exit) when destroyed.
class TrainerProcess {
 public:
  TrainerProcess(const std::filesystem::path& dir, uint64_t bytes,
                 uint64_t versions)
      : dir_(dir) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe");
    const std::string b = std::to_string(bytes);
    const std::string n = std::to_string(versions);
    const std::string d = dir.string();
    std::vector<char*> args = {
        const_cast<char*>(self.c_str()), const_cast<char*>(kTrainerFlag),
        const_cast<char*>(d.c_str()),    const_cast<char*>(b.c_str()),
        const_cast<char*>(n.c_str()),    nullptr};
    if (posix_spawn(&pid_, self.c_str(), nullptr, nullptr, args.data(),
                    environ) != 0) {
      pid_ = -1;
      return;
    }
    if (WaitForFile(dir / "port", 120)) {
      std::ifstream in(dir / "port");
      in >> port_;
    }
  }
  ~TrainerProcess() {
    if (pid_ <= 0) return;
    int status = 0;
    // Normally it has exited after the last ack; a failed test kills it.
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  int port() const { return port_; }
  // The trainer's CLOCK_MONOTONIC time of version v's publish (0: not
  // published within 120 s).
  uint64_t PublishedNs(uint64_t v) const {
    const auto path = dir_ / absl::StrCat("v", v, ".published");
    if (!WaitForFile(path, 120)) return 0;
    uint64_t ns = 0;
    std::ifstream(path) >> ns;
    return ns;
  }
  void Ack(uint64_t v) const {
    WriteFileAtomically(dir_ / absl::StrCat("v", v, ".ack"), "");
  }

 private:
  const std::filesystem::path dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace tandem::weights::ipc_pair
