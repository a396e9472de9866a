// NCCL weight broadcast between two GPUs (issue 22 item 6): GB/s of
// NcclBroadcastGroup::BroadcastDevice (device memory to device memory, the
// path of common/weights/broadcast/device_broadcast.h) and of Broadcast
// (host bytes through pinned and device staging, the host path), each
// against a device-to-device cudaMemcpyPeer of the same bytes from GPU 0
// to GPU 1, run side by side in one process: the ratios are what count.
// Then whole versions of the same size (one bf16 tensor in buckets of
// --bucket-mib) from device to device: PublishDeviceOverBroadcast into
// ReceiveDeviceOverBroadcast with the CRC-32C of every bucket checked on
// GPU 1, and with the SHA-256 check (DeviceSha256Check) on top.
// Ranks are threads, rank r on GPU r, rendezvous through a TCPStore on an
// ephemeral port. Also checks that the device broadcast is bit-exact.
//
//   nccl_broadcast_bench [--mib N] [--repeat R] [--bucket-mib B]
//
// Prints one line per case; exits 77 (skipped) without two CUDA devices,
// 1 on an error or a mismatch. tests/gpu/run.sh runs it.

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/broadcast/device_broadcast.h"
#include "common/weights/broadcast/device_digest_check.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/broadcast/nccl_broadcast_transport.h"
#include "tests/bench/bench_util.h"

namespace tandem {
namespace {

constexpr char kProgram[] = "nccl_broadcast_bench";

void Cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    bench::Die(kProgram, absl::StrCat(what, ": ", cudaGetErrorString(e)));
  }
}

// Two threads meet here before every timed round.
class Barrier {
 public:
  void Arrive() {
    const int round = round_.load();
    if (arrived_.fetch_add(1) == 1) {
      arrived_ = 0;
      ++round_;
      return;
    }
    while (round_.load() == round) std::this_thread::yield();
  }

 private:
  std::atomic<int> arrived_{0};
  std::atomic<int> round_{0};
};

struct Options {
  uint64_t mib = 1024;
  int repeat = 5;
  uint64_t bucket_mib = 64;
};

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> uint64_t {
      if (i + 1 >= argc) bench::Die(kProgram, arg + " needs a value");
      char* end = nullptr;
      const unsigned long long v = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0' || v == 0) {
        bench::Die(kProgram,
                   absl::StrCat(arg, ": want a positive integer, got '",
                                argv[i], "'"));
      }
      return v;
    };
    if (arg == "--mib") {
      o.mib = value();
    } else if (arg == "--repeat") {
      o.repeat = static_cast<int>(value());
    } else if (arg == "--bucket-mib") {
      o.bucket_mib = value();
    } else {
      bench::Die(kProgram, "unknown argument '" + arg +
                               "' (--mib N --repeat R --bucket-mib B)");
    }
  }
  return o;
}

int Main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  absl::StatusOr<int> devices = weights::NcclVisibleDevices();
  if (!devices.ok() || *devices < 2) {
    std::printf("%s: SKIPPED: %s\n", kProgram,
                devices.ok()
                    ? absl::StrCat(*devices, " CUDA device(s), needs 2").c_str()
                    : devices.status().ToString().c_str());
    return 77;
  }
  const uint64_t bytes = o.mib << 20;
  auto server =
      weights::GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(60));
  if (!server.ok()) bench::Die(kProgram, server.status().ToString());

  // Rank r's device buffer and a host copy of the bytes.
  uint8_t* d[2] = {nullptr, nullptr};
  std::vector<uint8_t> host(bytes);
  std::mt19937_64 rng(1);
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t r = rng();
    std::memcpy(host.data() + i, &r, std::min<uint64_t>(8, bytes - i));
  }
  for (int r = 0; r < 2; ++r) {
    Cuda(cudaSetDevice(r), "cudaSetDevice");
    Cuda(cudaMalloc(reinterpret_cast<void**>(&d[r]), bytes), "cudaMalloc");
  }
  Cuda(cudaSetDevice(0), "cudaSetDevice");
  Cuda(cudaMemcpy(d[0], host.data(), bytes, cudaMemcpyHostToDevice),
       "cudaMemcpy H2D");

  // Baseline: GPU 0 -> GPU 1 copy of the same bytes.
  Cuda(cudaMemcpyPeer(d[1], 1, d[0], 0, bytes), "cudaMemcpyPeer (warm-up)");
  std::vector<double> copy_s;
  for (int i = 0; i < o.repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    Cuda(cudaMemcpyPeer(d[1], 1, d[0], 0, bytes), "cudaMemcpyPeer");
    Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    copy_s.push_back(bench::SecondsSince(start));
  }
  Cuda(cudaSetDevice(1), "cudaSetDevice");
  Cuda(cudaMemset(d[1], 0, bytes), "cudaMemset");

  // A version of the same bytes: one bf16 tensor in buckets.
  auto layout = weights::FlatWeightLayout::Create(
      {{"w", v1::DTYPE_BF16, {static_cast<int64_t>(bytes / 2)}, bytes}},
      {.bucket_bytes = o.bucket_mib << 20, .alignment = 64});
  if (!layout.ok()) bench::Die(kProgram, layout.status().ToString());
  if (layout->total_bytes() != bytes) {
    bench::Die(kProgram, "--mib: the layout pads the buffer");
  }
  auto manifest = layout->BuildManifest(host, 1);
  if (!manifest.ok()) bench::Die(kProgram, manifest.status().ToString());

  // The two ranks; each round's time is the slower rank's.
  Barrier barrier;
  std::vector<double> device_s[2], host_s[2], version_s[2], sha_s[2];
  std::string sha_error;
  // Bit-exact: what GPU 1 holds after the device broadcasts, and after the
  // versions (cleared in between), is what GPU 0 sent.
  bool device_exact = false, version_exact = false;
  auto exact_on_gpu1 = [&] {
    std::vector<uint8_t> got(bytes);
    Cuda(cudaMemcpy(got.data(), d[1], bytes, cudaMemcpyDeviceToHost),
         "cudaMemcpy D2H");
    Cuda(cudaMemset(d[1], 0, bytes), "cudaMemset");
    return got == host;
  };
  std::string error[2];
  std::vector<uint8_t> host_received(bytes);
  auto rank = [&](int r) {
    Cuda(cudaSetDevice(r), "cudaSetDevice");
    weights::NcclGroupConfig c;
    c.store_port = (*server)->port();
    c.rank = r;
    c.world_size = 2;
    c.device = r;
    c.key_prefix = "bench";
    c.timeout = absl::Seconds(60);
    c.bucket_bytes = o.bucket_mib << 20;
    auto group = weights::NcclBroadcastGroup::Create(c);
    if (!group.ok()) {
      error[r] = group.status().ToString();
      return;
    }
    auto timed = [&](const std::function<absl::Status()>& f,
                     std::vector<double>* out) {
      barrier.Arrive();
      const auto start = std::chrono::steady_clock::now();
      absl::Status s = f();
      out->push_back(bench::SecondsSince(start));
      if (!s.ok() && error[r].empty()) error[r] = s.ToString();
    };
    auto device = [&] { return (*group)->BroadcastDevice(d[r], bytes); };
    auto via_host = [&] {
      return (*group)->Broadcast(
          absl::MakeSpan(r == 0 ? host.data() : host_received.data(), bytes));
    };
    std::vector<double> warm;
    timed(device, &warm);  // the communicator's first collective
    for (int i = 0; i < o.repeat; ++i) timed(device, &device_s[r]);
    if (r == 1) device_exact = exact_on_gpu1();
    timed(via_host, &warm);
    for (int i = 0; i < o.repeat; ++i) timed(via_host, &host_s[r]);
    auto version = [&](bool sha) -> absl::Status {
      if (r == 0) {
        return weights::PublishDeviceOverBroadcast(group->get(), *manifest,
                                                   d[0], bytes);
      }
      weights::DeviceReceiveOptions options;
      if (sha) {
        options.digest_check =
            weights::DeviceSha256Check(c10::Device(c10::kCUDA, 1));
      }
      uint64_t round = 0;
      auto got = weights::ReceiveDeviceOverBroadcast(group->get(), d[1], bytes,
                                                     &round, options);
      if (sha && !got.ok()) {
        sha_error = got.status().ToString();
        return absl::OkStatus();  // reported in its row
      }
      return got.status();
    };
    for (int i = 0; i < o.repeat; ++i) {
      timed([&] { return version(false); }, &version_s[r]);
    }
    if (r == 1) version_exact = exact_on_gpu1();
    for (int i = 0; i < o.repeat; ++i) {
      timed([&] { return version(true); }, &sha_s[r]);
    }
  };
  std::thread rank1(rank, 1);
  rank(0);
  rank1.join();
  for (const std::string& e : error) {
    if (!e.empty()) bench::Die(kProgram, e);
  }
  auto slower = [&](std::vector<double>* per_rank) {
    std::vector<double> out;
    for (size_t i = 0; i < per_rank[0].size(); ++i) {
      out.push_back(std::max(per_rank[0][i], per_rank[1][i]));
    }
    return bench::Median(out);
  };

  const bool host_exact = host_received == host;
  for (uint8_t* p : d) cudaFree(p);

  const double gb = static_cast<double>(bytes) / 1e9;
  const double copy = bench::Median(copy_s);
  const double device = slower(device_s);
  const double via_host = slower(host_s);
  const double version = slower(version_s);
  const double sha = slower(sha_s);
  std::printf("%s: %llu MiB, %d rounds (median), buckets of %llu MiB\n",
              kProgram, static_cast<unsigned long long>(o.mib), o.repeat,
              static_cast<unsigned long long>(o.bucket_mib));
  std::printf(
      "| case | GB/s | ratio to the GPU 0 -> GPU 1 copy | bit-exact |\n");
  std::printf("|---|---|---|---|\n");
  std::printf("| cudaMemcpyPeer GPU 0 -> GPU 1 | %.1f | 1.00 | |\n", gb / copy);
  std::printf(
      "| NCCL BroadcastDevice (device -> device) | %.1f | %.2f | %s |\n",
      gb / device, copy / device, device_exact ? "yes" : "NO");
  std::printf(
      "| NCCL Broadcast (host -> host, the host path) | %.1f | %.2f | %s |\n",
      gb / via_host, copy / via_host, host_exact ? "yes" : "NO");
  std::printf(
      "| version device -> device, CRC-32C per bucket on GPU 1 | %.1f | "
      "%.2f | %s |\n",
      gb / version, copy / version, version_exact ? "yes" : "NO");
  if (sha_error.empty()) {
    std::printf(
        "| version device -> device, CRC-32C + SHA-256 | %.1f | %.2f | |\n",
        gb / sha, copy / sha);
  } else {
    std::printf(
        "| version device -> device, CRC-32C + SHA-256 | failed: %s "
        "| | |\n",
        sha_error.c_str());
  }
  return device_exact && host_exact && version_exact && sha_error.empty() ? 0
                                                                          : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
