// What the staged update mode does on the rollout worker's receiving
// thread between a verified version and the engine's swap (issue 21 item
// 6): StagingWeights::Commit, then ModelWeights for the engine built over
// the committed flat buffer, either
//   copy  UnflattenModel: new tensors, every byte copied (before)
//   view  ViewFlatModel: tensors that view the buffer (now,
//         services/rollout/weight_subscriber_delivery.cc)
// on a ~70M-parameter Qwen3-shaped model. Rounds alternate the two (and
// their order), each on a freshly staged version; the weights built last
// round stay alive until the next round's are built, as the engine keeps
// its live weights until it swaps. Prints the median of each, and how
// many versions the staging had to receive into a new buffer because the
// old one was still held.
//
//   staged_swap_bench [rounds] [bf16|f32]   (defaults: 9, bf16)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/weights/model_flattening.h"
#include "common/weights/staging_weights.h"
#include "common/weights/weight_transport.h"
#include "tests/unit/model_test_util.h"
#include "tests/bench/bench_util.h"

namespace tandem::weights {
namespace {

using bench::Median;

[[noreturn]] void Die(const std::string& why) {
  bench::Die("staged_swap_bench", why);
}

int Main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 9;
  const bool f32 = argc > 2 && std::string(argv[2]) == "f32";
  model::ModelConfig config = model::testing::TinyQwen3Config();
  config.vocab_size = 32000;
  config.hidden_size = 512;
  config.intermediate_size = 1408;
  config.num_hidden_layers = 12;
  config.num_attention_heads = 8;
  config.num_key_value_heads = 4;
  config.head_dim = 64;
  config.dtype =
      f32 ? model::WeightDType::kFloat32 : model::WeightDType::kBFloat16;
  auto weights = model::RandomInit(config, 7);
  if (!weights.ok()) Die(weights.status().ToString());
  auto layout = LayoutForModel(**weights);
  if (!layout.ok()) Die(layout.status().ToString());
  auto flat = FlattenModel(**weights, *layout);
  if (!flat.ok()) Die(flat.status().ToString());
  weights->reset();
  auto staging = StagingWeights::Create(*layout, StagingMode::kDoubleBuffer);
  if (!staging.ok()) Die(staging.status().ToString());
  StagingWeights& s = **staging;

  std::vector<double> copy_s, view_s;
  std::shared_ptr<model::ModelWeights> live;  // what the engine holds
  for (int i = 0; i < 2 * rounds; ++i) {
    const uint64_t version = static_cast<uint64_t>(i) + 1;
    auto manifest = layout->BuildManifest(**flat, version);
    if (!manifest.ok()) Die(manifest.status().ToString());
    manifest->set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
    if (absl::Status st = StagePayload(&s, *manifest, **flat); !st.ok()) {
      Die(st.ToString());
    }
    // copy, view, view, copy, copy, view, ...
    const bool view = ((i / 2) % 2 == 0) == (i % 2 == 1);
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status st = s.Commit().status(); !st.ok()) Die(st.ToString());
    absl::StatusOr<std::shared_ptr<model::ModelWeights>> built =
        view ? ViewFlatModel(config, s.layout(), s.live_buffer())
             : UnflattenModel(config, s.layout(), s.live().bytes);
    if (!built.ok()) Die(built.status().ToString());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    (view ? view_s : copy_s).push_back(seconds);
    live = *std::move(built);  // the engine's swap releases the old ones
  }
  const double mib = static_cast<double>(layout->total_bytes()) / (1 << 20);
  std::printf("staged swap, %.0f MiB %s, %d rounds each (median)\n", mib,
              f32 ? "f32" : "bf16", rounds);
  std::printf("  copy (UnflattenModel)  %8.2f ms\n", Median(copy_s) * 1e3);
  std::printf("  view (ViewFlatModel)   %8.3f ms\n", Median(view_s) * 1e3);
  std::printf("  versions received into a new buffer: %llu of %d\n",
              static_cast<unsigned long long>(s.stats().staging_allocations),
              2 * rounds);
  return 0;
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) { return tandem::weights::Main(argc, argv); }
