#include "services/trainer/trainer_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/cluster/member_daemon.h"
#include "common/model/device.h"

namespace tandem::trainer {

void RegisterFields(config::ConfigSchema* schema, TrainerConfig* config) {
  config::AddServerOptions(schema, &config->server);
  cluster::AddCoordinatorAddress(schema, &config->coordinator_address);
  schema->AddString("checkpoint_dir", &config->checkpoint_dir,
                    "Directory where checkpoints are written (step-<N>/, "
                    "latest -> newest; the policy export is latest/hf).");
  schema->AddInt("checkpoint_every", &config->checkpoint_every, 0, INT64_MAX,
                 "Write a checkpoint every this many optimizer steps (one "
                 "step = one policy version; 1 = every version, after the "
                 "coordinator acknowledged it); 0 = only on stop and on the "
                 "SaveCheckpoint RPC. A trainer killed between checkpoints "
                 "resumes from the last one: the coordinator queues the "
                 "groups of later versions again (within max_lag) or counts "
                 "them lost.");
  schema->AddInt("checkpoint_keep", &config->checkpoint_keep, 1, 1 << 20,
                 "Checkpoints kept; older step-* directories are removed.");
  schema->AddBool("checkpoint_on_stop", &config->checkpoint_on_stop,
                  "Write a checkpoint on SIGTERM / graceful stop when the "
                  "trainer stepped since the last one.");
  schema->AddBool("resume", &config->resume,
                  "On start, resume from checkpoint_dir/latest when it "
                  "exists (weights, optimizer, step, version, RNG).");
  schema->AddString("model.path", &config->model_path,
                    "Initial policy: a Hugging Face directory; empty = the "
                    "built-in tiny model with random weights from model.seed "
                    "(the rollout workers' default).");
  schema->AddInt("model.seed", &config->model_seed, 0, INT64_MAX,
                 "Seed of the built-in model's random initial weights.");
  schema->AddInt("model.torch_threads", &config->torch_threads, 0, 1024,
                 "LibTorch intra-op threads; 0 = LibTorch's default.");
  schema->AddString("model.device", &config->device,
                    "Where the policy, its float32 master weights, the "
                    "AdamW state, the reference policy and the loss live: "
                    "cpu, cuda (the first visible GPU) or cuda:N. A device "
                    "this process cannot use stops the start (exit 2) with "
                    "the reason; there is no silent fallback.");
  schema->AddString("model.dtype", &config->dtype,
                    "Dtype of the forward and backward pass: auto "
                    "(bfloat16 on a GPU, float32 on the CPU), float32 or "
                    "bfloat16. The master weights and the optimizer state "
                    "stay float32; published versions keep the dtype of "
                    "model.path.");
  schema->AddEnum("training.logprobs_kernel", &config->logprobs_kernel,
                  {"auto", "aten", "cuda"},
                  "Per-token log-probs of the loss: auto = the fused CUDA "
                  "kernel (kernels/cuda) when model.device is a GPU, the "
                  "chunked ATen code on the CPU; aten = the chunked ATen "
                  "code everywhere; cuda = the kernel (needs a GPU).");
  schema->AddBool("training.enabled", &config->train,
                  "Pull scored groups, train and publish new versions.");
  schema->AddDouble("training.lr", &config->lr, 0, 1, "AdamW learning rate.");
  schema->AddInt("training.warmup_steps", &config->warmup_steps, 0, 1 << 30,
                 "Linear learning-rate warmup steps.");
  schema->AddEnum("training.schedule", &config->schedule,
                  {"constant", "cosine", "linear"},
                  "Learning rate after the warmup (by optimizer step): "
                  "constant, or a cosine or linear decay to lr * "
                  "training.min_lr_ratio at training.total_steps (then "
                  "constant there).");
  schema->AddInt("training.total_steps", &config->total_steps, 0, INT64_MAX,
                 "Cosine and linear schedules: the optimizer step where "
                 "the decay ends; must exceed training.warmup_steps.");
  schema->AddDouble("training.min_lr_ratio", &config->min_lr_ratio, 0, 1,
                    "Cosine and linear schedules: the final learning rate "
                    "as a fraction of training.lr.");
  schema->AddInt("training.micro_batch_tokens", &config->micro_batch_tokens, 0,
                 1 << 30,
                 "Gradient accumulation: forward and backward the batch in "
                 "micro-batches of at most this many packed (prompt + "
                 "completion) tokens, one optimizer step per batch; 0 = "
                 "the whole batch in one pass.");
  schema->AddDouble("training.max_grad_norm", &config->max_grad_norm, 0, 1e9,
                    "Gradient clipping norm.");
  schema->AddDouble("training.clip_low", &config->clip_low, 0, 1,
                    "PPO ratio clip below 1 (1 - clip_low).");
  schema->AddDouble("training.clip_high", &config->clip_high, 0, 10,
                    "PPO ratio clip above 1 (1 + clip_high).");
  schema->AddEnum(
      "training.advantage", &config->advantage, {"grpo", "dr_grpo"},
      "grpo: (r - mean) / (std + eps) per group; dr_grpo: r - mean.");
  schema->AddEnum("training.aggregation", &config->aggregation,
                  {"token", "sequence", "pipelinerl"},
                  "Loss aggregation: mean over tokens, over sequences, or "
                  "sum over tokens / number of sequences (PipelineRL).");
  schema->AddBool("training.dynamic_sampling", &config->dynamic_sampling,
                  "DAPO's dynamic sampling: leave the groups whose "
                  "completions all got the same reward (no advantage, no "
                  "policy gradient) out of the step, so the loss is "
                  "normalised over the groups that carry a signal; counted "
                  "in tandem_trainer_uniform_groups_total{outcome=dropped}. "
                  "Off: they count in the denominators (token-mean "
                  "aggregation then shrinks the update as more groups are "
                  "solved).");
  schema->AddBool("training.guide_failed_groups",
                  &config->guide_failed_groups,
                  "Reference guidance (mixed-policy GRPO, as LUFFY): a group "
                  "whose samples all failed (the same reward, below "
                  "training.guide_reward) and whose prompt has a reference "
                  "completion from the dataset gets that completion as one "
                  "more sample with reward training.guide_reward, trained "
                  "with importance ratio 1, so problems the policy never "
                  "solves still teach it; counted in "
                  "tandem_trainer_guided_groups_total.");
  schema->AddDouble("training.guide_reward", &config->guide_reward, -1e6, 1e6,
                    "Reward given to a reference completion "
                    "(training.guide_failed_groups); 1 is a correct answer "
                    "for every built-in verifier.");
  schema->AddDouble("training.kl_beta", &config->kl_beta, 0, 1e6,
                    "Coefficient of the k3 KL penalty to a frozen reference "
                    "policy (training.reference_model); 0 = no penalty and "
                    "no reference model is loaded.");
  schema->AddString("training.reference_model", &config->reference_model,
                    "Reference policy of the KL penalty: a Hugging Face "
                    "directory with the policy's vocabulary, held frozen in "
                    "float32; empty = the starting policy model.path (also "
                    "after a resume). Ignored while training.kl_beta is 0.");
  schema->AddInt("training.batch_max_tokens", &config->batch_max_tokens, 1,
                 1 << 30, "Token budget of one training batch.");
  schema->AddInt("training.batch_max_groups", &config->batch_max_groups, 0,
                 1 << 20, "Most groups per batch (0 = no bound).");
  schema->AddInt("training.pull_wait_ms", &config->pull_wait_ms, 0, 600000,
                 "How long one batch pull may wait for ready groups.");
  RegisterHeldoutEvalFields(schema, &config->eval);

  // Weight sync by broadcast.
  schema->AddBool("weight_sync.broadcast", &config->weight_broadcast,
                  "Broadcast each new version to the rollout workers of the "
                  "current membership epoch (Gloo); off = workers only pull.");
  schema->AddString("weight_sync.store_host", &config->weight_store_host,
                    "Host the broadcast rendezvous store (TCPStore) and Gloo "
                    "bind to and advertise; empty = the host of grpc_address "
                    "(127.0.0.1 when that is a wildcard such as 0.0.0.0).");
  schema->AddInt("weight_sync.store_port", &config->weight_store_port, 0, 65535,
                 "Port of the rendezvous store (TCPStore); 0 = any free port. "
                 "Not opened with tls.mode mtls: the rendezvous then goes "
                 "through the trainer's gRPC server (certificates checked).");
  schema->AddInt("weight_sync.data_port", &config->weight_data_port, 0, 65535,
                 "Port of the raw TCP data path that serves catch-up pulls "
                 "(bound on grpc_address's host, announced to pulling "
                 "workers, who fall back to the gRPC stream when they cannot "
                 "reach it); 0 = any free port.");
  schema->AddInt("weight_sync.data_max_connections",
                 &config->weight_data_max_connections, 1, 65536,
                 "Most connections open at once on the raw data path "
                 "(waiting for their request, queued or streaming). Over it, "
                 "a new connection evicts the oldest one that has not sent "
                 "its request, or is closed at once when every slot is "
                 "queued or streaming (counted in "
                 "tandem_weight_sync_data_connections_dropped_total).");
  schema->AddInt("weight_sync.data_threads", &config->weight_data_threads, 1,
                 256,
                 "Threads that stream catch-up pulls on the raw data path; "
                 "more concurrent pulls wait in a queue. One more thread "
                 "accepts connections and reads their requests.");
  schema->AddInt("weight_sync.data_request_timeout_ms",
                 &config->weight_data_request_timeout_ms, 10, 3600000,
                 "A raw data path connection that has not sent its whole "
                 "request this long after it was accepted is closed.");
  schema->AddInt("weight_sync.data_send_timeout_ms",
                 &config->weight_data_send_timeout_ms, 100, 3600000,
                 "A raw data path stream whose receiver reads nothing for "
                 "this long is dropped, freeing its thread.");
  schema->AddBool("weight_sync.shared_memory", &config->weight_shared_memory,
                  "Offer full versions to catch-up pulls from the same host "
                  "as POSIX shared-memory segments (/dev/shm), which workers "
                  "map instead of reading every byte from a socket; workers "
                  "that cannot open them (another host, a container without "
                  "a shared IPC namespace) fall back to the socket. Each "
                  "full version is copied into its segment when it is "
                  "published, on the training thread, used or not: it pays "
                  "off when several same-host workers pull each version "
                  "(docs/benchmarks.md).");
  schema->AddInt("weight_sync.cuda_ipc_versions",
                 &config->weight_cuda_ipc_versions, 0, 16,
                 "With model.device on a GPU: how many of the newest "
                 "published versions are also kept flattened in device "
                 "memory (one extra copy of the weights each), offered to "
                 "catch-up pulls from workers on this host's GPUs by CUDA "
                 "IPC; a worker copies the version device-to-device. An "
                 "offered buffer lives until that pull ends, even after "
                 "newer versions push it out. 0: off. Ignored on the CPU.");
  schema->AddEnum("weight_sync.digest", &config->weight_digest,
                  {"sha256", "off"},
                  "sha256: every published version's manifest (sent over "
                  "gRPC) carries the SHA-256 of its full weights, and "
                  "workers refuse a version whose received bytes do not "
                  "match it, whatever path they took (broadcast, raw or "
                  "gRPC pull, shared memory, delta); off: per-bucket "
                  "CRC-32C only, which catches accidents but not bytes "
                  "altered on purpose. Costs about 0.6 s per GiB of "
                  "weights on the trainer and on each worker "
                  "(docs/benchmarks.md).");
  schema->AddEnum("weight_sync.tree_digest", &config->weight_tree_digest,
                  {"auto", "on", "off"},
                  "on: every published version's manifest also carries its "
                  "tree digest (SHA-256 over 4 KiB leaves, fan-in 128; "
                  "docs/operations.md), which workers whose received "
                  "weights are on a GPU check there, in parallel, instead "
                  "of the sequential SHA-256; off: not computed; auto: on "
                  "when model.device is a GPU. Costs the trainer about as "
                  "much hashing as the SHA-256 again, on up to 4 threads "
                  "(docs/benchmarks.md, \"Tree digest\").");
  schema->AddInt("weight_sync.timeout_ms", &config->weight_broadcast_timeout_ms,
                 100, 3600000,
                 "Deadline of each broadcast rendezvous and collective (ms); "
                 "a dead receiver aborts the group after it.");
  schema->AddInt("weight_sync.anchor_every", &config->weight_anchor_every, 1,
                 1 << 30,
                 "bfloat16 publishing: every version that is a multiple of "
                 "this is a full anchor, the others are sparse deltas on the "
                 "version before (pulled by workers that hold it); 1 = every "
                 "version full. float32 versions are always full.");
  schema->AddDouble(
      "weight_sync.delta_max_density", &config->weight_delta_max_density, 0, 1,
      "Largest changed fraction of the bf16 weights (bit "
      "patterns against the version before) that is published "
      "as a delta; a denser version is a full anchor. In (0, 1].");
}

std::string TrainingConfigJson(const TrainerConfig& c) {
  const nlohmann::json j = {{"model_path", c.model_path},
                            {"model_seed", c.model_seed},
                            {"lr", c.lr},
                            {"warmup_steps", c.warmup_steps},
                            {"schedule", c.schedule},
                            {"total_steps", c.total_steps},
                            {"min_lr_ratio", c.min_lr_ratio},
                            {"max_grad_norm", c.max_grad_norm},
                            {"clip_low", c.clip_low},
                            {"clip_high", c.clip_high},
                            {"advantage", c.advantage},
                            {"aggregation", c.aggregation},
                            {"dynamic_sampling", c.dynamic_sampling},
                            {"guide_failed_groups", c.guide_failed_groups},
                            {"guide_reward", c.guide_reward},
                            {"kl_beta", c.kl_beta},
                            {"reference_model", c.reference_model}};
  return j.dump();
}

absl::Status Validate(const TrainerConfig& config) {
  RETURN_IF_ERROR(model::CheckDeviceUsable("model.device", config.device));
  RETURN_IF_ERROR(
      model::ParseDTypeName("model.dtype", config.dtype).status());
  if (config.logprobs_kernel == "cuda" && config.device == "cpu") {
    return absl::InvalidArgumentError(
        "training.logprobs_kernel cuda needs model.device cuda or cuda:N, "
        "got cpu");
  }
  if (config.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("checkpoint_dir must not be empty");
  }
  if (!(config.kl_beta >= 0.0) || !std::isfinite(config.kl_beta)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.kl_beta must be a finite number >= 0, got ", config.kl_beta));
  }
  if (!(config.weight_delta_max_density > 0.0 &&
        config.weight_delta_max_density <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_sync.delta_max_density must be in (0, 1], got ",
                     config.weight_delta_max_density));
  }
  if (config.schedule != "constant" &&
      config.total_steps <= config.warmup_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.schedule: ", config.schedule,
        " needs training.total_steps > training.warmup_steps, got ",
        config.total_steps, " <= ", config.warmup_steps));
  }
  return absl::OkStatus();
}

}  // namespace tandem::trainer
