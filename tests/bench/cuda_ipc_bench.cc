// Publish-to-live of a version by CUDA IPC, the way a rollout worker on a
// CUDA device makes it live (issue 22: <= 10 ms for 1 GiB; docs/gpu.md,
// tests/gpu/run.sh), stage by stage, against a plain device-to-device copy
// of the same bytes run in the same process.
//
//   cuda_ipc_bench [--mib 1024] [--versions 6] [--cpu]
//
// A trainer process (tests/gpu/cuda_ipc_pair.h) publishes versions of a
// bf16 Qwen2-shaped model of about --mib MiB (BenchModelConfig) into its
// DeviceVersionRing; this process is the worker on the same GPU and does
// what WeightSubscriber::GoLiveOnDevice does (weight_subscriber_device.cc):
//
//   rpc       GetManifest long poll + FetchWeights (the offer), from the
//             trainer's publish to the start of the sink's copy;
//   ipc_copy  CudaIpcDeviceSink::CopyOffer in the pull receiver's handoff
//             mode: open the handle, device-to-device copy, close;
//   go_live   GoLiveFromStagedTensor on the handed-over copy: CRC-32C per
//             bucket on the device (crc, timed inside this call), torch
//             isfinite, SHA-256 of the manifest (TensorSha256), views;
//   stage     the engine's swap: StagedWeightSource::Stage, then the
//             engine's ReadyVersion + Commit (the pointer swap).
//
// publish_to_live is the trainer's CLOCK_MONOTONIC time just before it put
// the version in its ring and store, to this process's time after the
// swap. The host staging that follows a device go-live (a D2H copy off the
// engine's critical path) is not part of it and not run here.
//
// The split of go_live is measured after the version is live, on the same
// copy, by separate passes (so it does not slow publish_to_live): finite =
// VerifyStagedTensor without a digest, less its CRC time; digest =
// VerifyTensorWeightSha256 alone; tree_digest = the device tree digest
// alone (null without a tree root or a device, e.g. --cpu). Like a GPU
// trainer by default, the trainer side puts a tree root in each manifest,
// and go_live checks it as the worker does (the sink's tree function), so
// go_live holds the tree digest, not the plain SHA-256.
// The baseline is cudaMemcpy device-to-device of the same bytes. The first
// version is a warm-up. One JSON line per version, then a summary line of
// medians. Without a CUDA device it prints why and exits 0.
//
// --cpu runs the same go-live and swap code on CPU tensors with the host
// CRC-32C and the host finite scan, in one process: "ipc_copy" is a
// memcpy of the payload into a staging buffer (the worker's receive), the
// baseline a memcpy of the same bytes; there is no RPC (rpc_ms null).
// ctest runs it small as a smoke
// (bench_cuda_ipc_cpu_smoke); it is not a GPU number.

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/decoder_model.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/weights/cuda_ipc_device.h"
#include "common/weights/device_digest.h"
#include "common/weights/device_go_live.h"
#include "common/weights/model_flattening.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/staging_weights.h"
#include "kernels/crc32c.h"
#include "services/rollout/weight_update_sources.h"
#include "tests/bench/bench_util.h"
#include "tests/gpu/cuda_ipc_pair.h"

namespace tandem::weights {
namespace {

constexpr char kProgram[] = "cuda_ipc_bench";

double MsBetween(uint64_t from_ns, uint64_t to_ns) {
  return static_cast<double>(to_ns - from_ns) / 1e6;
}

template <typename T>
T OrDie(absl::StatusOr<T> got, const std::string& what) {
  if (!got.ok()) bench::Die(kProgram, what + ": " + got.status().ToString());
  return *std::move(got);
}

void OkOrDie(const absl::Status& status, const std::string& what) {
  if (!status.ok()) bench::Die(kProgram, what + ": " + status.ToString());
}

// A bf16 Qwen2-shaped model of about `bytes` bytes (within a vocabulary
// row): as many layers as fit, the rest in the tied embedding's rows.
model::ModelConfig BenchModelConfig(uint64_t bytes) {
  model::ModelConfig c;
  c.architecture = model::Architecture::kQwen2;
  c.hidden_size = bytes >= (uint64_t{256} << 20) ? 2048 : 256;
  c.intermediate_size = c.hidden_size * 11 / 4;
  c.head_dim = 64;
  c.num_attention_heads = c.hidden_size / c.head_dim;
  c.num_key_value_heads = c.num_attention_heads / 4;
  c.max_position_embeddings = 4096;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  c.dtype = model::WeightDType::kBFloat16;
  c.eos_token_ids = {1};
  c.vocab_size = 1024;
  auto total = [&c] {
    return OrDie(LayoutForConfig(c), "layout").total_bytes();
  };
  c.num_hidden_layers = 1;
  while (true) {
    ++c.num_hidden_layers;
    if (total() > bytes) {
      --c.num_hidden_layers;
      break;
    }
  }
  const uint64_t have = total();
  const uint64_t row = static_cast<uint64_t>(c.hidden_size) * 2;
  if (have < bytes) c.vocab_size += static_cast<int64_t>((bytes - have) / row);
  return c;
}

FlatWeightLayout BenchLayout(uint64_t bytes) {
  return OrDie(LayoutForConfig(BenchModelConfig(bytes)), "layout");
}

// The CUDA IPC sink of the worker, timed: when CopyOffer started and how
// long it took (everything else is the device sink's).
class TimedIpcSink final : public CudaIpcSink {
 public:
  explicit TimedIpcSink(CudaIpcSink* sink) : sink_(sink) {}
  const v1::CudaIpcPeer& peer() const override { return sink_->peer(); }
  const CudaIpcLocalView& local() const override { return sink_->local(); }
  absl::Status CopyOffer(const v1::CudaIpcOffer& offer, int device) override {
    started_ns_ = ipc_pair::MonotonicNs();
    absl::Status copied = sink_->CopyOffer(offer, device);
    copy_ms_ = MsBetween(started_ns_, ipc_pair::MonotonicNs());
    return copied;
  }
  absl::Status ReadStaged(uint64_t offset, absl::Span<uint8_t> dst) override {
    return sink_->ReadStaged(offset, dst);
  }
  StagedIpcCopy TakeStagedCopy() override { return sink_->TakeStagedCopy(); }
  bool hands_over() const override { return sink_->hands_over(); }

  uint64_t started_ns() const { return started_ns_; }
  double copy_ms() const { return copy_ms_; }

 private:
  CudaIpcSink* const sink_;
  uint64_t started_ns_ = 0;
  double copy_ms_ = 0;
};

// One version's times (ms). The go_live split (finite, digest,
// tree_digest) comes from separate passes after the version is live;
// tree_digest is nullopt when there is no tree root or tree function.
struct StageTimes {
  double rpc = 0;
  double ipc_copy = 0;
  double go_live = 0;
  double crc = 0;
  double finite = 0;
  double digest = 0;
  std::optional<double> tree_digest;
  double stage = 0;
  double publish_to_live = 0;
  double baseline_copy = 0;
};

// The worker's side after the copy: verify and view (the real
// GoLiveFromStagedTensor, CRC timed inside it), then the engine's swap.
// Returns the time the version became live.
uint64_t GoLiveAndSwap(const model::ModelConfig& config,
                       const FlatWeightLayout& layout,
                       const v1::WeightManifest& manifest,
                       const at::Tensor& staged, const BucketCrc32c& crc32c,
                       const TreeSha256Fn& tree,
                       rollout::StagedWeightSource& source, uint64_t live,
                       StageTimes& times) {
  const uint64_t version = manifest.policy_version();
  double crc_ms = 0;
  DeviceGoLiveOptions go;
  go.crc32c = [&crc32c, &crc_ms](const uint8_t* d,
                                 uint64_t n) -> absl::StatusOr<uint32_t> {
    const uint64_t start = ipc_pair::MonotonicNs();
    absl::StatusOr<uint32_t> crc = crc32c(d, n);
    crc_ms += MsBetween(start, ipc_pair::MonotonicNs());
    return crc;
  };
  // As the worker's GoLiveOnDevice: the tree root on the device when
  // there is one, else the plain SHA-256.
  go.expected_sha256 = manifest.sha256();
  go.expected_tree_sha256 = manifest.tree_sha256();
  go.tree_sha256 = tree;
  const uint64_t start = ipc_pair::MonotonicNs();
  std::shared_ptr<model::ModelWeights> weights =
      OrDie(GoLiveFromStagedTensor(config, manifest, layout, staged, go),
            absl::StrCat("going live with version ", version));
  const uint64_t verified = ipc_pair::MonotonicNs();
  source.Stage(version, std::move(weights));
  if (source.ReadyVersion(live) != version) {
    bench::Die(kProgram, absl::StrCat("version ", version, " not ready"));
  }
  const uint64_t swapped =
      OrDie(source.Commit(version), absl::StrCat("swap to ", version));
  if (swapped != version) bench::Die(kProgram, "swapped to another version");
  const uint64_t now = ipc_pair::MonotonicNs();
  times.go_live = MsBetween(start, verified);
  times.crc = crc_ms;
  times.stage = MsBetween(verified, now);
  return now;
}

// The split of go_live, by separate passes on the live copy.
void SplitGoLive(const FlatWeightLayout& layout,
                 const v1::WeightManifest& manifest, const at::Tensor& staged,
                 const BucketCrc32c& crc32c, const TreeSha256Fn& tree,
                 StageTimes& times) {
  double crc_ms = 0;
  DeviceGoLiveOptions no_digest;
  no_digest.crc32c = [&crc32c, &crc_ms](
                         const uint8_t* d,
                         uint64_t n) -> absl::StatusOr<uint32_t> {
    const uint64_t start = ipc_pair::MonotonicNs();
    absl::StatusOr<uint32_t> crc = crc32c(d, n);
    crc_ms += MsBetween(start, ipc_pair::MonotonicNs());
    return crc;
  };
  uint64_t start = ipc_pair::MonotonicNs();
  OkOrDie(VerifyStagedTensor(manifest, layout, staged, no_digest),
          "verifying without the digest");
  times.finite = MsBetween(start, ipc_pair::MonotonicNs()) - crc_ms;
  start = ipc_pair::MonotonicNs();
  OkOrDie(VerifyTensorWeightSha256(manifest.policy_version(), manifest.sha256(),
                                   staged),
          "SHA-256 of the copy");
  times.digest = MsBetween(start, ipc_pair::MonotonicNs());
  times.tree_digest = std::nullopt;
  if (tree != nullptr && !manifest.tree_sha256().empty()) {
    start = ipc_pair::MonotonicNs();
    const std::string root =
        OrDie(tree(static_cast<const uint8_t*>(staged.data_ptr()),
                   static_cast<uint64_t>(staged.numel())),
              "tree digest of the copy");
    times.tree_digest = MsBetween(start, ipc_pair::MonotonicNs());
    if (root != manifest.tree_sha256()) {
      bench::Die(kProgram, "the copy's tree root differs from the manifest's");
    }
  }
}

// The live weights the engine starts from: views into zeros on `device`.
std::shared_ptr<model::DecoderModel> InitialModel(
    const model::ModelConfig& config, const FlatWeightLayout& layout,
    at::Device device) {
  const at::Tensor zeros =
      at::zeros({static_cast<int64_t>(layout.total_bytes())},
                at::TensorOptions().dtype(at::kByte).device(device));
  return std::make_shared<model::DecoderModel>(
      OrDie(ViewStagedTensor(config, layout, zeros), "initial weights"));
}

void PrintVersion(uint64_t v, const FlatWeightLayout& layout, bool cpu,
                  const StageTimes& t) {
  std::printf(
      "{\"version\": %llu, \"mib\": %.1f, \"cpu\": %s, "
      "\"publish_to_live_ms\": %.3f, \"rpc_ms\": %s, "
      "\"ipc_copy_ms\": %.3f, \"go_live_ms\": %.3f, \"crc_ms\": %.3f, "
      "\"finite_ms\": %.3f, \"digest_ms\": %.3f, \"tree_digest_ms\": %s, "
      "\"stage_ms\": %.3f, \"baseline_copy_ms\": %.3f}\n",
      static_cast<unsigned long long>(v),
      static_cast<double>(layout.total_bytes()) / (1 << 20),
      cpu ? "true" : "false", t.publish_to_live,
      cpu ? "null" : absl::StrFormat("%.3f", t.rpc).c_str(), t.ipc_copy,
      t.go_live, t.crc, t.finite, t.digest,
      t.tree_digest.has_value() ? absl::StrCat(*t.tree_digest).c_str() : "null",
      t.stage, t.baseline_copy);
  std::fflush(stdout);
}

void PrintSummary(const FlatWeightLayout& layout, bool cpu,
                  const std::vector<StageTimes>& all) {
  if (all.empty()) bench::Die(kProgram, "--versions must be >= 2");
  auto median = [&all](double StageTimes::*field) {
    std::vector<double> v;
    for (const StageTimes& t : all) v.push_back(t.*field);
    return bench::Median(v);
  };
  const double live = median(&StageTimes::publish_to_live);
  const double copy = median(&StageTimes::baseline_copy);
  std::vector<double> trees;
  for (const StageTimes& t : all) {
    if (t.tree_digest.has_value()) trees.push_back(*t.tree_digest);
  }
  const std::string tree_median =
      trees.size() == all.size() ? absl::StrFormat("%.3f", bench::Median(trees))
                                 : std::string("null");
  std::printf(
      "{\"summary\": true, \"mib\": %.1f, \"cpu\": %s, \"versions\": %zu, "
      "\"publish_to_live_ms_median\": %.3f, \"rpc_ms_median\": %s, "
      "\"ipc_copy_ms_median\": %.3f, \"go_live_ms_median\": %.3f, "
      "\"crc_ms_median\": %.3f, \"finite_ms_median\": %.3f, "
      "\"digest_ms_median\": %.3f, \"tree_digest_ms_median\": %s, "
      "\"stage_ms_median\": %.3f, \"baseline_copy_ms_median\": %.3f, "
      "\"ratio\": %.2f}\n",
      static_cast<double>(layout.total_bytes()) / (1 << 20),
      cpu ? "true" : "false", all.size(), live,
      cpu ? "null" : absl::StrFormat("%.3f", median(&StageTimes::rpc)).c_str(),
      median(&StageTimes::ipc_copy), median(&StageTimes::go_live),
      median(&StageTimes::crc), median(&StageTimes::finite),
      median(&StageTimes::digest), tree_median.c_str(),
      median(&StageTimes::stage), copy, live / copy);
}

double DeviceCopyMs(void* dst, const void* src, uint64_t bytes) {
  cudaDeviceSynchronize();
  const uint64_t start = ipc_pair::MonotonicNs();
  cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  return MsBetween(start, ipc_pair::MonotonicNs());
}

int RunDevice(uint64_t mib, uint64_t versions) {
  const uint64_t bytes = mib << 20;
  const model::ModelConfig config = BenchModelConfig(bytes);
  const FlatWeightLayout layout = BenchLayout(bytes);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("tandem-cuda-ipc-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::vector<StageTimes> all;
  {
    ipc_pair::TrainerProcess trainer(dir, bytes, versions);
    if (trainer.port() <= 0) bench::Die(kProgram, "the trainer did not start");
    auto device_sink = OrDie(CudaIpcDeviceSink::Create(0), "sink");
    if (!device_sink->hands_over()) {
      bench::Die(kProgram,
                 "this build's sink hands no copy over (no CUDA "
                 "kernels): the worker would stage on the host");
    }
    TimedIpcSink sink(device_sink.get());
    auto staging = OrDie(
        StagingWeights::Create(layout, StagingMode::kDoubleBuffer), "staging");
    GrpcPullReceiver receiver(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(trainer.port()),
                            grpc::InsecureChannelCredentials()),
        {.cuda_ipc = &sink, .cuda_ipc_handoff = true});
    rollout::StagedWeightSource source(
        InitialModel(config, layout, at::Device(at::kCUDA, 0)));
    void* a = nullptr;
    void* b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess ||
        cudaMalloc(&b, bytes) != cudaSuccess) {
      bench::Die(kProgram, "cudaMalloc of the baseline buffers failed");
    }
    cudaMemset(a, 1, bytes);
    uint64_t live = 0;
    for (uint64_t v = 1; v <= versions; ++v) {
      const std::string which = absl::StrCat("version ", v);
      const uint64_t got = OrDie(
          receiver.ReceiveNext(staging.get(), absl::Now() + absl::Seconds(120)),
          which);
      if (got != v)
        bench::Die(kProgram, which + ": got " + std::to_string(got));
      const std::optional<v1::WeightManifest> manifest =
          receiver.TakeCudaIpcHandoff();
      if (!manifest.has_value()) {
        bench::Die(kProgram, which + " was staged, not handed over");
      }
      const StagedIpcCopy copy = sink.TakeStagedCopy();
      if (copy.memory == nullptr) bench::Die(kProgram, which + ": no copy");
      const at::Tensor staged =
          OrDie(StagedCopyTensor(copy), which + ": viewing the copy");
      StageTimes t;
      const uint64_t published = trainer.PublishedNs(v);
      const uint64_t live_ns =
          GoLiveAndSwap(config, layout, *manifest, staged, copy.crc32c,
                        copy.tree_sha256, source, live, t);
      live = v;
      t.rpc = MsBetween(published, sink.started_ns());
      t.ipc_copy = sink.copy_ms();
      t.publish_to_live = MsBetween(published, live_ns);
      // The host staging follows a device go-live in the worker (off the
      // critical path): bring it to v so the next Plan asks for v + 1.
      OkOrDie(staging->CommitVerifiedElsewhere(
                  *manifest,
                  [&staged](absl::Span<uint8_t> dst) -> absl::Status {
                    if (cudaMemcpy(dst.data(), staged.data_ptr(), dst.size(),
                                   cudaMemcpyDeviceToHost) != cudaSuccess) {
                      return absl::InternalError("D2H copy failed");
                    }
                    return absl::OkStatus();
                  }),
              which + ": host staging");
      SplitGoLive(layout, *manifest, staged, copy.crc32c, copy.tree_sha256, t);
      t.baseline_copy = DeviceCopyMs(b, a, bytes);
      PrintVersion(v, layout, false, t);
      if (v > 1) all.push_back(t);
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
  PrintSummary(layout, false, all);
  return 0;
}

// --cpu: the same go-live and swap on CPU tensors (see the file comment).
int RunCpu(uint64_t mib, uint64_t versions) {
  const uint64_t bytes = mib << 20;
  const model::ModelConfig config = BenchModelConfig(bytes);
  const FlatWeightLayout layout = BenchLayout(bytes);
  const uint64_t n = layout.total_bytes();
  rollout::StagedWeightSource source(
      InitialModel(config, layout, at::Device(at::kCPU)));
  // Two staging buffers, touched once: version v is copied into buffer
  // v % 2, never the live one (v - 1's).
  const at::Tensor buffers[2] = {
      at::zeros({static_cast<int64_t>(n)}, at::kByte),
      at::zeros({static_cast<int64_t>(n)}, at::kByte)};
  std::vector<uint8_t> payload(n), baseline(n);
  const BucketCrc32c host_crc = [](const uint8_t* d,
                                   uint64_t size) -> absl::StatusOr<uint32_t> {
    return kernels::Crc32c(d, size);
  };
  std::vector<StageTimes> all;
  uint64_t live = 0;
  for (uint64_t v = 1; v <= versions; ++v) {
    ipc_pair::FillPayload(v, absl::MakeSpan(payload));
    const v1::WeightManifest manifest =
        OrDie(layout.BuildManifest(payload, v), "manifest");
    StageTimes t;
    const uint64_t published = ipc_pair::MonotonicNs();
    const at::Tensor& staged = buffers[v % 2];
    std::memcpy(staged.data_ptr(), payload.data(), n);
    const uint64_t copied = ipc_pair::MonotonicNs();
    const uint64_t live_ns = GoLiveAndSwap(config, layout, manifest, staged,
                                           host_crc, nullptr, source, live, t);
    live = v;
    t.ipc_copy = MsBetween(published, copied);
    t.publish_to_live = MsBetween(published, live_ns);
    SplitGoLive(layout, manifest, staged, host_crc, nullptr, t);
    const uint64_t start = ipc_pair::MonotonicNs();
    std::memcpy(baseline.data(), payload.data(), n);
    t.baseline_copy = MsBetween(start, ipc_pair::MonotonicNs());
    PrintVersion(v, layout, true, t);
    if (v > 1) all.push_back(t);
  }
  PrintSummary(layout, true, all);
  return 0;
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) {
  namespace w = tandem::weights;
  if (argc > 1 && std::string(argv[1]) == w::ipc_pair::kTrainerFlag) {
    return w::ipc_pair::RunIpcTrainer(argc, argv, w::BenchLayout);
  }
  uint64_t mib = 1024, versions = 6;
  bool cpu = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cpu") {
      cpu = true;
      continue;
    }
    uint64_t* into = arg == "--mib"        ? &mib
                     : arg == "--versions" ? &versions
                                           : nullptr;
    if (into == nullptr || i + 1 >= argc ||
        !absl::SimpleAtoi(argv[++i], into) || *into == 0) {
      std::fprintf(stderr,
                   "usage: cuda_ipc_bench [--mib N] [--versions N] [--cpu] "
                   "(got '%s')\n",
                   arg.c_str());
      return 2;
    }
  }
  if (versions < 2) {
    std::fprintf(stderr, "cuda_ipc_bench: --versions must be >= 2 (got %llu)\n",
                 static_cast<unsigned long long>(versions));
    return 2;
  }
  if (cpu) return w::RunCpu(mib, versions);
  if (!w::CudaIpcDeviceVisible()) {
    std::printf(
        "SKIPPED: no CUDA device is visible to this process (cuda_ipc_bench "
        "--cpu runs the same go-live on the CPU)\n");
    return 0;
  }
  return w::RunDevice(mib, versions);
}
