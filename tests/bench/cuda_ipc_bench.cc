// Publish-to-live of a version by CUDA IPC against a plain device-to-device
// copy of the same bytes (issue 22 item 4; docs/gpu.md, tests/gpu/run.sh).
//
//   cuda_ipc_bench [--mib 1024] [--versions 6]
//
// A trainer process (tests/gpu/cuda_ipc_pair.h) publishes versions of
// --mib MiB from device memory; this process, a worker on the same GPU,
// receives each (GrpcPullReceiver + CudaIpcDeviceSink: open the handle,
// device-to-device copy, close, then the host-side verification every pull
// has: CRC-32C, finite check, SHA-256) and commits it. publish-to-live is
// the trainer's CLOCK_MONOTONIC time just before it put the version in its
// store and ring, to this process's time after Commit(). The baseline, run
// in the same process between versions, is cudaMemcpy device-to-device of
// the same number of bytes. Also timed there: the SHA-256 of the worker's
// device staging copy by TensorSha256 (common/weights/device_digest.h,
// pinned pieces), what verifying the version on the device instead of on
// the host would cost. The first version is a warm-up. Prints one JSON
// line per version and a summary line with medians and their ratio.
// Without a CUDA device it prints why and exits 77.

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/weights/cuda_ipc_device.h"
#include "common/weights/device_digest.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/staging_weights.h"
#include "tests/bench/bench_util.h"
#include "tests/gpu/cuda_ipc_pair.h"

namespace tandem::weights {
namespace {

constexpr char kProgram[] = "cuda_ipc_bench";

double DeviceCopyMs(void* dst, const void* src, uint64_t bytes) {
  cudaDeviceSynchronize();
  const uint64_t start = ipc_pair::MonotonicNs();
  cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  return static_cast<double>(ipc_pair::MonotonicNs() - start) / 1e6;
}

int Run(uint64_t mib, uint64_t versions) {
  const uint64_t bytes = mib << 20;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("tandem-cuda-ipc-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::vector<double> to_live, baseline, digest;
  {
    ipc_pair::TrainerProcess trainer(dir, bytes, versions);
    if (trainer.port() <= 0) bench::Die(kProgram, "the trainer did not start");
    const FlatWeightLayout layout = ipc_pair::PairLayout(bytes);
    auto sink = CudaIpcDeviceSink::Create(0);
    if (!sink.ok()) bench::Die(kProgram, sink.status().ToString());
    auto staging = StagingWeights::Create(layout, StagingMode::kDoubleBuffer);
    if (!staging.ok()) bench::Die(kProgram, staging.status().ToString());
    GrpcPullReceiver receiver(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(trainer.port()),
                            grpc::InsecureChannelCredentials()),
        {.cuda_ipc = sink->get()});
    void* a = nullptr;
    void* b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess ||
        cudaMalloc(&b, bytes) != cudaSuccess) {
      bench::Die(kProgram, "cudaMalloc of the baseline buffers failed");
    }
    cudaMemset(a, 1, bytes);
    for (uint64_t v = 1; v <= versions; ++v) {
      auto got = receiver.ReceiveNext(staging->get(),
                                      absl::Now() + absl::Seconds(120));
      if (!got.ok() || *got != v) {
        bench::Die(kProgram, "version " + std::to_string(v) + ": " +
                                 got.status().ToString());
      }
      if (!(*staging)->Commit().ok()) bench::Die(kProgram, "commit failed");
      const uint64_t live = ipc_pair::MonotonicNs();
      const double ms =
          static_cast<double>(live - trainer.PublishedNs(v)) / 1e6;
      const double copy_ms = DeviceCopyMs(b, a, bytes);
      const at::Tensor staged = at::from_blob(
          const_cast<void*>((*sink)->staged()),
          {static_cast<int64_t>((*sink)->staged_bytes())},
          at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
      const uint64_t hash_start = ipc_pair::MonotonicNs();
      if (!TensorSha256(staged).ok()) bench::Die(kProgram, "TensorSha256");
      const double sha_ms =
          static_cast<double>(ipc_pair::MonotonicNs() - hash_start) / 1e6;
      std::printf(
          "{\"version\": %llu, \"mib\": %llu, \"publish_to_live_ms\": %.3f, "
          "\"device_copy_ms\": %.3f, \"device_sha256_ms\": %.3f}\n",
          static_cast<unsigned long long>(v),
          static_cast<unsigned long long>(mib), ms, copy_ms, sha_ms);
      std::fflush(stdout);
      if (v > 1) {
        to_live.push_back(ms);
        baseline.push_back(copy_ms);
        digest.push_back(sha_ms);
      }
      trainer.Ack(v);
    }
    const PullStats stats = receiver.stats();
    if (stats.cuda_ipc_versions != versions) {
      bench::Die(kProgram, "only " + std::to_string(stats.cuda_ipc_versions) +
                               " versions came by CUDA IPC");
    }
    cudaFree(a);
    cudaFree(b);
  }
  std::filesystem::remove_all(dir);
  if (to_live.empty()) bench::Die(kProgram, "--versions must be >= 2");
  const double live = bench::Median(to_live);
  const double copy = bench::Median(baseline);
  std::printf(
      "{\"summary\": true, \"mib\": %llu, \"versions\": %zu, "
      "\"publish_to_live_ms_median\": %.3f, \"device_copy_ms_median\": %.3f, "
      "\"ratio\": %.2f, \"device_sha256_ms_median\": %.3f}\n",
      static_cast<unsigned long long>(mib), to_live.size(), live, copy,
      live / copy, bench::Median(digest));
  return 0;
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) {
  namespace w = tandem::weights;
  if (argc > 1 && std::string(argv[1]) == w::ipc_pair::kTrainerFlag) {
    return w::ipc_pair::RunIpcTrainer(argc, argv);
  }
  uint64_t mib = 1024, versions = 6;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    uint64_t* into = arg == "--mib"        ? &mib
                     : arg == "--versions" ? &versions
                                           : nullptr;
    if (into == nullptr || i + 1 >= argc ||
        !absl::SimpleAtoi(argv[++i], into)) {
      std::fprintf(
          stderr, "usage: cuda_ipc_bench [--mib N] [--versions N] (got '%s')\n",
          arg.c_str());
      return 2;
    }
  }
  if (!w::CudaIpcDeviceVisible()) {
    std::printf("SKIPPED: no CUDA device is visible to this process\n");
    return 77;
  }
  return w::Run(mib, versions);
}
