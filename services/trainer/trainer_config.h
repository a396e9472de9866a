#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"
#include "services/trainer/heldout_eval.h"

namespace tandem::trainer {

struct TrainerConfig {
  config::ServerOptions server;
  std::string coordinator_address = "127.0.0.1:50051";
  // Checkpoints (layout: services/trainer/checkpoint.h, docs/operations.md).
  std::string checkpoint_dir = "checkpoints";
  int64_t checkpoint_every = 50;  // optimizer steps; 0 = no periodic ones
  int64_t checkpoint_keep = 2;
  bool checkpoint_on_stop = true;
  bool resume = true;
  // Initial policy: a Hugging Face directory, or empty for the built-in
  // tiny model (random weights from model_seed, as the rollout workers).
  std::string model_path;
  int64_t model_seed = 1;
  int64_t torch_threads = 1;
  // Where the policy, its optimizer state, the reference policy and the
  // loss live (common/model/device.h): cpu | cuda | cuda:N. dtype is the
  // dtype of the forward and backward pass: auto (bfloat16 on CUDA, float32
  // on the CPU) | float32 | bfloat16; the master weights and AdamW state are
  // float32 either way.
  std::string device = "cpu";
  std::string dtype = "auto";
  // Per-token log-probs: auto (the fused CUDA kernel on a GPU, the chunked
  // ATen code on the CPU) | aten | cuda.
  std::string logprobs_kernel = "auto";
  // Training.
  bool train = true;
  double lr = 1e-4;
  int64_t warmup_steps = 0;
  // constant | cosine | linear (after warmup)
  std::string schedule = "constant";
  int64_t total_steps = 0;  // cosine, linear: steps until lr * min_lr_ratio
  double min_lr_ratio = 0.0;
  double max_grad_norm = 1.0;
  int64_t micro_batch_tokens = 0;  // 0 = the whole batch in one pass
  double clip_low = 0.2;
  double clip_high = 0.2;
  std::string advantage = "grpo";     // grpo | dr_grpo
  std::string aggregation = "token";  // token | sequence | pipelinerl
  // Leave groups whose rewards are all equal out of the step (DAPO).
  bool dynamic_sampling = false;
  bool guide_failed_groups = false;
  double guide_reward = 1.0;
  // KL penalty to a frozen reference policy (k3); 0 = none, nothing loaded.
  double kl_beta = 0.0;
  // Hugging Face directory of the reference policy; empty = model.path (the
  // built-in model from model.seed when that is empty too).
  std::string reference_model;
  int64_t batch_max_tokens = 4096;
  int64_t batch_max_groups = 16;
  int64_t pull_wait_ms = 1000;
  // Held-out accuracy of the built-in task (eval.*).
  HeldoutEvalConfig eval;
  // ---- Weight sync by broadcast (weight_sync.*) ----
  // Host the rendezvous store for broadcast groups (broadcast on); rollout
  // workers of each membership epoch receive new versions from it. Pull
  // (the WeightServer) stays available for catch-up either way.
  bool weight_broadcast = true;
  // Address the rendezvous store and Gloo listen on and advertise; empty =
  // the host of server.grpc_address (127.0.0.1 if that is a wildcard).
  // Port 0 = any.
  std::string weight_store_host;
  int64_t weight_store_port = 0;
  int64_t weight_data_port = 0;
  // Bounds of the raw data path (common/weights/weight_server.h).
  int64_t weight_data_max_connections = 64;
  int64_t weight_data_threads = 4;
  int64_t weight_data_request_timeout_ms = 10000;
  int64_t weight_data_send_timeout_ms = 30000;
  // Offer full versions to same-host pulls as shared-memory segments
  // (common/weights/shared_weight_segment.h). Off by default: making a
  // segment costs about as much as one socket pull, so it pays off only
  // when several same-host workers pull each version (docs/benchmarks.md).
  bool weight_shared_memory = false;
  // On a CUDA model.device: how many of the newest published versions are
  // also kept flattened in device memory and offered to same-host workers
  // by CUDA IPC (common/weights/cuda_ipc.h); 0 turns that off. Ignored on
  // the CPU.
  int64_t weight_cuda_ipc_versions = 2;
  // "sha256": each published version's manifest carries the SHA-256 of its
  // full flat buffer, which workers check before a version goes live
  // (whatever path its bytes took); "off": CRC-32C only. About 1.7 GB/s on
  // each side (docs/benchmarks.md, "Weight digest").
  std::string weight_digest = "sha256";
  // "on": each manifest also carries the tree digest of the version
  // (WeightManifest.tree_sha256, common/weights/tree_digest.h), which a
  // worker with its staged bytes on a GPU checks on the device in place of
  // the sequential SHA-256; "off": not computed; "auto": on when
  // model.device is a GPU. Costs about as much host hashing as the
  // SHA-256 again, spread over up to 4 threads.
  std::string weight_tree_digest = "auto";
  // Deadline of each broadcast rendezvous and collective (ms).
  int64_t weight_broadcast_timeout_ms = 10000;
  // ---- Sparse delta sync (weight_sync.*), bfloat16 publishing only ----
  // Every version v with v % anchor_every == 0 is a full anchor; the others
  // are published as a delta on v-1 when dense enough to pay
  // (common/weights/delta_publisher.h). 1 = every version full.
  int64_t weight_anchor_every = 16;
  // Largest changed fraction of bf16 weights published as a delta.
  double weight_delta_max_density = 0.5;
};

void RegisterFields(config::ConfigSchema* schema, TrainerConfig* config);
absl::Status Validate(const TrainerConfig& config);

// The settings that shape the optimisation trajectory, as a JSON object:
// stored in every checkpoint so a resume under different ones is logged.
std::string TrainingConfigJson(const TrainerConfig& config);

}  // namespace tandem::trainer
