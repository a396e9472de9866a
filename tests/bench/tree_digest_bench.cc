// The tree digest (common/weights/tree_digest.h) against the plain SHA-256
// it travels beside, side by side on one buffer (issue 22: the digest a GPU
// checks in milliseconds; what it costs the trainer, which computes both
// from its host bytes).
//
//   tree_digest_bench [MiB] [rounds] [threads]  (defaults: 1024, 5, 4)
//
// Each round times, on the host:
//   copy        memcpy of the buffer (the baseline of per-byte work)
//   sha256      WeightSha256 (OpenSSL, one sequential chain)
//   tree_1t     WeightTreeSha256 on one thread (the same work, in leaves)
//   tree_Nt     WeightTreeSha256 on `threads` threads
// and prints the medians, GB/s, and tree / sha256 ratios: tree_1t / sha256
// is the extra hashing a trainer with weight_sync.tree_digest on pays per
// version (on one core); tree_Nt / sha256 the wall time it adds.
// With a CUDA device (builds with the CUDA kernels only), also:
//   d2d_copy    cudaMemcpy device to device of the same bytes
//   tree_dev    kernels::cuda::Sha256TreeDevice (root checked equal to the
//               host's)
// and tree_dev / d2d_copy (issue 22's publish-to-live budget: 10 ms for
// 1 GiB).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/weights/tree_digest.h"
#include "common/weights/weight_buffer.h"
#include "common/weights/weight_digest.h"
#include "tests/bench/bench_util.h"

#if TANDEM_TREE_BENCH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/bf16_delta_cuda.h"
#include "kernels/cuda/sha256_tree_cuda.h"
#endif

namespace tandem::weights {
namespace {

using bench::Median;
constexpr auto Seconds = bench::SecondsSince;

[[noreturn]] void Die(const std::string& why) {
  bench::Die("tree_digest_bench", why);
}

#if TANDEM_TREE_BENCH_CUDA
// The device rows; false when there is no device.
bool DeviceRows(const WeightBuffer& flat, int rounds, const std::string& host,
                std::vector<double>* d2d, std::vector<double>* tree) {
  if (!kernels::cuda::DeviceAvailable()) return false;
  uint8_t* a = nullptr;
  uint8_t* b = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&a), flat.size()) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&b), flat.size()) != cudaSuccess ||
      cudaMemcpy(a, flat.data(), flat.size(), cudaMemcpyHostToDevice) !=
          cudaSuccess) {
    Die("cannot stage the buffer on the device");
  }
  // One warm-up of each (module load, allocator pool).
  for (int r = -1; r < rounds; ++r) {
    auto t = std::chrono::steady_clock::now();
    if (cudaMemcpy(b, a, flat.size(), cudaMemcpyDeviceToDevice) !=
            cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      Die("device copy failed");
    }
    if (r >= 0) d2d->push_back(Seconds(t));
    t = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> root =
        kernels::cuda::Sha256TreeDevice(a, flat.size());
    if (r >= 0) tree->push_back(Seconds(t));
    if (!root.ok()) Die(root.status().ToString());
    if (*root != host) Die("the device tree root differs from the host's");
  }
  cudaFree(a);
  cudaFree(b);
  return true;
}
#endif

int Main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const int threads = argc > 3 ? std::atoi(argv[3]) : kTreeDigestThreads;
  const uint64_t bytes = mib << 20;
  if (bytes == 0 || rounds <= 0 || threads <= 0) {
    Die("usage: tree_digest_bench [MiB] [rounds] [threads]");
  }
  WeightBuffer src(bytes), flat(bytes);
  std::mt19937_64 rng(1);
  auto* words = reinterpret_cast<uint64_t*>(src.data());
  for (uint64_t i = 0; i < bytes / 8; ++i) words[i] = rng();
  std::memcpy(flat.data(), src.data(), bytes);

  std::vector<double> copy, sha, tree1, treen;
  std::string root;
  for (int r = 0; r < rounds; ++r) {
    auto t = std::chrono::steady_clock::now();
    std::memcpy(flat.data(), src.data(), bytes);
    copy.push_back(Seconds(t));
    t = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> d = WeightSha256(flat.span());
    sha.push_back(Seconds(t));
    t = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> one = WeightTreeSha256(flat.span(), 1);
    tree1.push_back(Seconds(t));
    t = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> many = WeightTreeSha256(flat.span(), threads);
    treen.push_back(Seconds(t));
    if (!d.ok() || !one.ok() || !many.ok()) Die("a digest failed");
    if (*one != *many) Die("the tree root depends on the thread count");
    root = *one;
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  auto row = [&](const std::string& name, double s) {
    std::printf("%-9s %9.2f ms  %6.2f GB/s\n", name.c_str(), s * 1e3, gb / s);
  };
  std::printf("weights %llu MiB, %d rounds, medians\n",
              static_cast<unsigned long long>(mib), rounds);
  row("copy", Median(copy));
  row("sha256", Median(sha));
  row("tree_1t", Median(tree1));
  row("tree_" + std::to_string(threads) + "t", Median(treen));
  std::printf("tree_1t / sha256 = %.2f\n", Median(tree1) / Median(sha));
  std::printf("tree_%dt / sha256 = %.2f\n", threads,
              Median(treen) / Median(sha));
#if TANDEM_TREE_BENCH_CUDA
  std::vector<double> d2d, tree_dev;
  if (DeviceRows(flat, rounds, root, &d2d, &tree_dev)) {
    row("d2d_copy", Median(d2d));
    row("tree_dev", Median(tree_dev));
    std::printf("tree_dev / d2d_copy = %.2f\n", Median(tree_dev) / Median(d2d));
  } else {
    std::printf("device: no CUDA device, skipped\n");
  }
#else
  std::printf("device: not built (no CUDA kernels in this build)\n");
#endif
  return 0;
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) { return tandem::weights::Main(argc, argv); }
