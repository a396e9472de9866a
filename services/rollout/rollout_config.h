#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"

namespace tandem::rollout {

struct RolloutConfig {
  config::ServerOptions server;
  std::string coordinator_address = "127.0.0.1:50051";
  // Hugging Face model directory; empty = the built-in tiny model.
  std::string model_path;
  int64_t model_seed = 1;
  // LibTorch intra-op threads (0 = LibTorch's default).
  int64_t torch_threads = 1;
  // Where the weights, KV cache and activations live (common/model/device.h):
  // cpu | cuda | cuda:N; and their dtype: auto | float32 | bfloat16.
  std::string device = "cpu";
  std::string dtype = "auto";
  int64_t max_num_seqs = 64;
  int64_t max_batched_tokens = 4096;
  int64_t num_kv_blocks = 4096;
  int64_t block_size = 16;
  std::string batching = "continuous";     // continuous | static
  std::string update_policy = "inflight";  // inflight | drain
  std::string kv_policy = "keep";          // keep | recompute
  std::string update_mode = "staged";      // staged | inplace
  std::string kv_layout = "auto";          // auto | contiguous | paged
  bool cuda_graphs = false;
  std::string paged_attention = "gather";  // auto | gather | kernel
  // Prompts leased ahead of the engine.
  int64_t prefetch_prompts = 16;
  // ---- Weight sync (weight_sync.*) ----
  // broadcast: join the coordinator's broadcast group once caught up, with
  // automatic fallback to pull; pull: always pull from the trainer.
  std::string weight_sync = "broadcast";
  // Address Gloo binds for its pairs on this host; empty = the host of
  // server.grpc_address (127.0.0.1 if that is a wildcard).
  std::string weight_sync_bind_host;
  // Deadline of a broadcast rendezvous and of every collective (ms).
  int64_t weight_sync_timeout_ms = 10000;
  // Broadcast mode: keep a WatchCluster stream open and ask the coordinator
  // about the group when it announces a version or epoch.
  bool weight_sync_watch = true;
  // Broadcast mode: how often the coordinator is asked anyway while the
  // stream is open (ms); without a stream it is asked every 50 ms.
  int64_t weight_sync_poll_interval_ms = 1000;
  // Pulls ask for a same-host shared-memory segment of a full version.
  bool weight_sync_shared_memory = true;
  // On a CUDA model.device, pulls ask for the trainer's device copy of a
  // full version by CUDA IPC (same host).
  bool weight_sync_cuda_ipc = true;
  // ---- OpenAI-compatible endpoint (openai.*, docs/openai-endpoint.md) ----
  // host:port of the HTTP endpoint; empty = off.
  std::string openai_listen;
  // Model id in /v1/models and responses; empty = the model directory's
  // name ("tandem-arith" for the built-in model).
  std::string openai_model_name;
  int64_t openai_max_connections = 64;
  int64_t openai_max_body_bytes = 4 << 20;
  int64_t openai_request_timeout_s = 600;
  int64_t openai_default_max_tokens = 16;
  int64_t openai_max_n = 16;
  // Leases whose environment is this name are offered to agent harnesses
  // over the endpoint instead of being driven here; empty = none.
  std::string openai_harness_environment;
  int64_t openai_harness_idle_timeout_s = 60;
  int64_t openai_harness_max_episodes = 64;
  int64_t openai_harness_max_episode_s = 1800;  // 0 = no bound
  // ---- Multi-turn episodes (environment.*, docs/environments.md) ----
  // host:port of the tandem.v1.Environment service that runs the episodes
  // of leases naming an environment; empty = none (such leases are
  // returned to the coordinator).
  std::string environment_address;
  int64_t environment_open_timeout_ms = 10000;
  int64_t environment_step_timeout_ms = 30000;
  int64_t environment_close_timeout_ms = 5000;
  // EpisodeLimits (services/rollout/episode_driver.h).
  int64_t environment_max_turns = 8;
  int64_t environment_max_turn_tokens = 256;
  int64_t environment_max_episode_tokens = 4096;
  // Episode sequences that may wait for their environment on top of
  // max_num_seqs running or waiting ones (they hold KV blocks, no batch
  // slot).
  int64_t environment_max_parked = 1024;
  // While episodes are parked, new work is admitted only while the KV
  // cache is less full than this (parked caches are dropped and
  // recomputed when it runs short).
  double environment_park_kv_fraction = 0.9;
  // Texts that end a model turn when it writes one (EpisodeCodec).
  std::vector<std::string> environment_turn_stop_strings;
  // How the model writes tool calls: hermes (also qwen, demo) | llama3.
  std::string environment_tool_call_format = "hermes";
  // The chat template's end-of-turn text (observations are rendered after
  // it).
  std::string environment_turn_end = "<|im_end|>";
};

void RegisterFields(config::ConfigSchema* schema, RolloutConfig* config);
absl::Status Validate(const RolloutConfig& config);

}  // namespace tandem::rollout
