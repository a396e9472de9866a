// Cost of the SHA-256 of a whole weight version on the trainer's publish
// path (issue 25 item 3), side by side with what a publish already does to
// every byte.
//
//   weight_digest_bench [MiB] [rounds]     (defaults: 256 MiB, 7 rounds)
//
// On one buffer of random bf16 weights in 64 MiB buckets (smaller buffers:
// one bucket), each round times:
//   copy      memcpy of the buffer (flattening the model into it)
//   crc       the per-bucket CRC-32C (FlatWeightLayout::BucketCrcs)
//   sha256    WeightSha256 of the whole buffer (OpenSSL EVP)
//   manifest  FlatWeightLayout::BuildManifest (crc + sha256 + specs)
//   seal      AES-256-GCM of the whole buffer bucket by bucket (WeightSeal,
//             what a broadcast or raw stream under tls.mode mtls adds on
//             the sending side)
//   open      the same opened in place, tags checked (the receiving side)
// and prints the median of each, GB/s, and sha256 / (copy + manifest): the
// share of the publish's per-byte work the digest adds. A receiver pays
// the same sha256 once per version, on its receiving thread. The last two
// lines put seal beside the plaintext publish's per-byte work (copy +
// manifest) and open beside the plaintext receive's (crc + sha256).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/weights/data_plane_seal.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/weight_buffer.h"
#include "common/weights/weight_digest.h"
#include "tests/bench/bench_util.h"

namespace tandem::weights {
namespace {

using bench::Median;
constexpr auto Seconds = bench::SecondsSince;

[[noreturn]] void Die(const std::string& why) {
  bench::Die("weight_digest_bench", why);
}

int Main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  const uint64_t bytes = mib << 20;
  if (bytes == 0 || rounds <= 0) Die("usage: weight_digest_bench [MiB] [rounds]");
  auto layout = FlatWeightLayout::Create(
      {{"w", v1::DTYPE_BF16, {static_cast<int64_t>(bytes / 2)}, bytes}},
      {.bucket_bytes = std::min<uint64_t>(bytes, uint64_t{64} << 20),
       .alignment = 64});
  if (!layout.ok()) Die(layout.status().ToString());
  WeightBuffer src(bytes), flat(bytes);
  std::mt19937_64 rng(1);
  auto* words = reinterpret_cast<uint64_t*>(src.data());
  for (uint64_t i = 0; i < bytes / 8; ++i) words[i] = rng() & 0x3f7f3f7f3f7f3f7fULL;
  std::memcpy(flat.data(), src.data(), bytes);

  auto key = NewDataPlaneKey(1);
  auto salt = NewSealSalt();
  if (!key.ok() || !salt.ok()) Die("no key");
  auto seal = WeightSeal::Derive(*key, *salt, kSealPurposeBroadcast);
  if (!seal.ok()) Die(seal.status().ToString());
  WeightBuffer sealed(bytes);
  std::vector<SealTag> tags(layout->buckets().size());
  std::vector<double> copy, crc, sha, manifest, seal_s, open_s;
  for (int r = 0; r < rounds; ++r) {
    auto t = std::chrono::steady_clock::now();
    std::memcpy(flat.data(), src.data(), bytes);
    copy.push_back(Seconds(t));
    t = std::chrono::steady_clock::now();
    std::vector<uint32_t> crcs = layout->BucketCrcs(flat.span());
    crc.push_back(Seconds(t));
    t = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> d = WeightSha256(flat.span());
    sha.push_back(Seconds(t));
    if (!d.ok()) Die(d.status().ToString());
    t = std::chrono::steady_clock::now();
    auto m = layout->BuildManifest(flat.span(), 1);
    manifest.push_back(Seconds(t));
    if (!m.ok() || m->sha256() != *d || crcs.empty()) Die("manifest mismatch");
    t = std::chrono::steady_clock::now();
    for (size_t b = 0; b < layout->buckets().size(); ++b) {
      const auto& bucket = layout->buckets()[b];
      if (!seal->Seal(b, {}, flat.span().subspan(bucket.offset, bucket.size),
                      sealed.data() + bucket.offset, &tags[b])
               .ok()) {
        Die("seal failed");
      }
    }
    seal_s.push_back(Seconds(t));
    t = std::chrono::steady_clock::now();
    for (size_t b = 0; b < layout->buckets().size(); ++b) {
      const auto& bucket = layout->buckets()[b];
      uint8_t* at = sealed.data() + bucket.offset;
      if (!seal->Open(b, {}, {at, bucket.size}, tags[b], at, "bench").ok()) {
        Die("open failed");
      }
    }
    open_s.push_back(Seconds(t));
    if (std::memcmp(sealed.data(), flat.data(), bytes) != 0) {
      Die("open is not bit-exact");
    }
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  auto row = [&](const char* name, double s) {
    std::printf("%-9s %9.2f ms  %6.2f GB/s\n", name, s * 1e3, gb / s);
  };
  std::printf("weights %llu MiB, %d rounds, medians\n",
              static_cast<unsigned long long>(mib), rounds);
  row("copy", Median(copy));
  row("crc", Median(crc));
  row("sha256", Median(sha));
  row("manifest", Median(manifest));
  row("seal", Median(seal_s));
  row("open", Median(open_s));
  std::printf("sha256 / (copy + manifest) = %.2f\n",
              Median(sha) / (Median(copy) + Median(manifest)));
  std::printf("seal / (copy + manifest) = %.2f\n",
              Median(seal_s) / (Median(copy) + Median(manifest)));
  std::printf("open / (crc + sha256) = %.2f\n",
              Median(open_s) / (Median(crc) + Median(sha)));
  return 0;
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) { return tandem::weights::Main(argc, argv); }
