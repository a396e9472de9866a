#include "services/rollout/rollout_config.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/cluster/member_daemon.h"
#include "common/model/device.h"

namespace tandem::rollout {

void RegisterFields(config::ConfigSchema* schema, RolloutConfig* config) {
  config::AddServerOptions(schema, &config->server);
  cluster::AddCoordinatorAddress(schema, &config->coordinator_address);
  schema->AddString("model.path", &config->model_path,
                    "Hugging Face model directory (config.json, "
                    "*.safetensors, tokenizer.json); empty = the built-in "
                    "tiny model of the arithmetic task.");
  schema->AddInt("model.seed", &config->model_seed, 0, INT64_MAX,
                 "Seed of the built-in model's random initial weights.");
  schema->AddInt("model.torch_threads", &config->torch_threads, 0, 1024,
                 "LibTorch intra-op threads; 0 = LibTorch's default.");
  schema->AddString("model.device", &config->device,
                    "Where the weights, the KV cache and the forward pass "
                    "live: cpu, cuda (the first visible GPU) or cuda:N. A "
                    "device this process cannot use stops the start (exit "
                    "2) with the reason; there is no silent fallback.");
  schema->AddString("model.dtype", &config->dtype,
                    "Weight and compute dtype: auto (bfloat16 on a GPU, "
                    "the checkpoint's own dtype on the CPU), float32 or "
                    "bfloat16. Versions from the trainer are converted to "
                    "it.");
  schema->AddInt("engine.max_num_seqs", &config->max_num_seqs, 1, 65536,
                 "Most sequences decoded together in one batch.");
  schema->AddInt("engine.max_batched_tokens", &config->max_batched_tokens, 1,
                 1 << 24, "Most tokens computed in one engine step.");
  schema->AddInt("engine.num_kv_blocks", &config->num_kv_blocks, 1, 1 << 24,
                 "KV-cache capacity in blocks.");
  schema->AddInt("engine.block_size", &config->block_size, 1, 4096,
                 "Token slots per KV-cache block.");
  schema->AddEnum("engine.batching", &config->batching,
                  {"continuous", "static"},
                  "continuous admits work as soon as capacity frees; static "
                  "(a benchmark baseline) only into an empty batch.");
  schema->AddEnum("engine.update_policy", &config->update_policy,
                  {"inflight", "drain"},
                  "inflight swaps weights at the next step boundary; drain "
                  "(a baseline) finishes running sequences first.");
  schema->AddEnum("engine.kv_policy", &config->kv_policy, {"keep", "recompute"},
                  "After a weight update, running sequences keep their KV "
                  "cache or recompute it.");
  schema->AddEnum("engine.update_mode", &config->update_mode,
                  {"staged", "inplace"},
                  "staged receives into a second buffer and swaps pointers "
                  "at a step boundary; inplace holds one copy: the engine "
                  "parks at a step boundary while a version is received "
                  "into the live weights (needs update_policy inflight).");
  schema->AddEnum("engine.kv_layout", &config->kv_layout,
                  {"auto", "contiguous", "paged"},
                  "How the KV cache is laid out: contiguous keeps one "
                  "growable tensor per layer and sequence; paged allocates "
                  "one pool of engine.num_kv_blocks blocks of "
                  "engine.block_size tokens per layer on model.device at "
                  "the first step and gathers each step's keys and values "
                  "from it (on the CPU as fast at batch 1 and about 1.5x "
                  "at batch 8 and 32, docs/benchmarks.md); auto is paged.");
  schema->AddBool("engine.cuda_graphs", &config->cuda_graphs,
                  "With a paged KV cache on a CUDA device, decode-only "
                  "steps replay a CUDA graph captured per bucket of batch "
                  "size and length (again after each staged weight swap). "
                  "Off by default: not yet run on a GPU (docs/gpu.md).");
  schema->AddEnum("engine.paged_attention", &config->paged_attention,
                  {"auto", "gather", "kernel"},
                  "Attention of decode-only steps over a paged KV cache: "
                  "gather copies every sequence's keys and values into a "
                  "padded batch for one scaled_dot_product_attention; "
                  "kernel reads them in place through the block tables "
                  "(a CUDA kernel on GPUs, its C++ reference on the CPU, "
                  "where it measured faster, docs/benchmarks.md); "
                  "auto is currently kernel on every device. Prefill and "
                  "mixed steps always gather. gather by default: the "
                  "kernel has not yet run on a GPU (docs/gpu.md).");
  schema->AddInt("prefetch_prompts", &config->prefetch_prompts, 1, 1 << 20,
                 "Leased prompts kept queued ahead of the engine.");

  // Weight sync.
  schema->AddEnum("weight_sync.mode", &config->weight_sync,
                  {"broadcast", "pull"},
                  "broadcast joins the trainer's broadcast group once caught "
                  "up (falls back to pull on failures); pull always pulls "
                  "from the trainer's weight server.");
  schema->AddString("weight_sync.bind_host", &config->weight_sync_bind_host,
                    "Address Gloo binds for broadcast pairs on this host; "
                    "empty = the host of grpc_address (127.0.0.1 when that "
                    "is a wildcard such as 0.0.0.0).");
  schema->AddInt("weight_sync.timeout_ms", &config->weight_sync_timeout_ms, 100,
                 3600000,
                 "Deadline of a broadcast rendezvous and of every collective "
                 "(ms); a dead peer aborts the group after it.");
  schema->AddBool("weight_sync.watch", &config->weight_sync_watch,
                  "Broadcast mode: keep a WatchCluster stream to the "
                  "coordinator and ask it about the group as soon as it "
                  "announces a version or epoch; false polls every 50 ms.");
  schema->AddBool("weight_sync.shared_memory",
                  &config->weight_sync_shared_memory,
                  "Catch-up pulls ask the trainer for a full version as a "
                  "POSIX shared-memory segment (/dev/shm) and map it when "
                  "the trainer offers one (its weight_sync.shared_memory) "
                  "and it can be opened here; otherwise the bytes come "
                  "over the socket as before.");
  schema->AddBool("weight_sync.cuda_ipc", &config->weight_sync_cuda_ipc,
                  "With model.device on a GPU: catch-up pulls ask the "
                  "trainer for a full version in its device memory (CUDA "
                  "IPC), when the trainer runs on this host on a GPU and "
                  "keeps device copies (its weight_sync.cuda_ipc_versions); "
                  "the worker copies it device-to-device, then verifies it "
                  "as any pull. Otherwise, or when the offer cannot be "
                  "opened here, the bytes come as before. Ignored on the "
                  "CPU.");
  schema->AddInt("weight_sync.poll_interval_ms",
                 &config->weight_sync_poll_interval_ms, 10, 600000,
                 "Broadcast mode: how often the coordinator is asked about "
                 "the group while the WatchCluster stream is open (ms), and "
                 "how long a worker outside the group waits for a newer "
                 "version by pull; at most half the coordinator's "
                 "weight_sync.report_timeout_ms. Without a stream (watch "
                 "false, or a coordinator that does not serve it) it is "
                 "asked every 50 ms.");

  // OpenAI-compatible endpoint.
  schema->AddString("openai.listen", &config->openai_listen,
                    "host:port of the OpenAI-compatible HTTP endpoint "
                    "(/v1/models, /v1/completions, /v1/chat/completions; "
                    "docs/openai-endpoint.md); port 0 picks a free one; "
                    "empty = off.");
  schema->AddString("openai.model_name", &config->openai_model_name,
                    "Model id the endpoint reports; empty = the name of "
                    "model.path's directory (tandem-arith for the built-in "
                    "model).");
  schema->AddInt("openai.max_connections", &config->openai_max_connections, 1,
                 65536,
                 "Most open HTTP connections; one more is answered 503.");
  schema->AddInt("openai.max_body_bytes", &config->openai_max_body_bytes, 1024,
                 1 << 30, "Largest request body (bytes); larger is 413.");
  schema->AddInt("openai.request_timeout_s", &config->openai_request_timeout_s,
                 1, 86400,
                 "A generation not finished after this long is cancelled "
                 "(504).");
  schema->AddInt("openai.default_max_tokens",
                 &config->openai_default_max_tokens, 1, 1 << 24,
                 "max_tokens of a completions request that leaves it out "
                 "(capped by what the context leaves); chat requests "
                 "default to the whole context left.");
  schema->AddInt("openai.max_n", &config->openai_max_n, 1, 1024,
                 "Largest n (samples per request).");
  schema->AddString(
      "openai.harness_environment", &config->openai_harness_environment,
      "Leases whose dataset row names this environment are offered to agent "
      "harnesses over the endpoint (POST /tandem/v1/episodes:claim; "
      "docs/openai-endpoint.md, \"Training a black-box agent\") instead of "
      "being run here; needs openai.listen. Empty = none.");
  schema->AddInt("openai.harness_idle_timeout_s",
                 &config->openai_harness_idle_timeout_s, 1, 86400,
                 "A harness episode with no claim, turn or finish for this "
                 "long (s) is abandoned: its whole lease goes back to the "
                 "coordinator.");
  schema->AddInt("openai.harness_max_episodes",
                 &config->openai_harness_max_episodes, 1, 1 << 20,
                 "Harness episodes held (offered, claimed, or finished and "
                 "waiting for their group); while they reach it the worker "
                 "leases only tasks of other environments.");
  schema->AddInt("openai.harness_max_episode_s",
                 &config->openai_harness_max_episode_s, 0, 7 * 86400,
                 "A harness episode's whole life (s), from the offer of its "
                 "lease: past it the lease goes back to the coordinator even "
                 "while its harness is still sending turns. 0 = no bound.");

  // Multi-turn episodes.
  schema->AddString("environment.address", &config->environment_address,
                    "host:port of the tandem.v1.Environment service (e.g. "
                    "the verifier's gRPC address) that runs the episodes "
                    "of leases naming an environment (docs/environments.md); "
                    "empty = none: such leases are returned to the "
                    "coordinator, refused with a reason naming this key. "
                    "Needs a model with a chat template.");
  schema->AddInt("environment.open_timeout_ms",
                 &config->environment_open_timeout_ms, 1, 3600000,
                 "Deadline of an OpenEpisode call (ms); a failed open ends "
                 "the episode environment_failed.");
  schema->AddInt("environment.step_timeout_ms",
                 &config->environment_step_timeout_ms, 1, 3600000,
                 "Deadline of a Step call (ms); an environment that does "
                 "not answer in time ends the episode environment_failed.");
  schema->AddInt("environment.close_timeout_ms",
                 &config->environment_close_timeout_ms, 1, 3600000,
                 "Deadline of a CloseEpisode call (ms).");
  schema->AddInt("environment.max_turns", &config->environment_max_turns, 1,
                 1 << 20,
                 "Model turns per episode; an episode the environment has "
                 "not ended by then ends turn_limit.");
  schema->AddInt("environment.max_turn_tokens",
                 &config->environment_max_turn_tokens, 1, 1 << 24,
                 "Generated tokens per model turn (also capped by the "
                 "lease's max_tokens).");
  schema->AddInt("environment.max_episode_tokens",
                 &config->environment_max_episode_tokens, 1, 1 << 24,
                 "Completion tokens per episode, the model's and the "
                 "environment's; more ends it token_limit.");
  schema->AddInt("environment.max_parked", &config->environment_max_parked,
                 0, 1 << 20,
                 "Episode sequences that may wait for their environment on "
                 "top of engine.max_num_seqs running ones: they keep their "
                 "KV blocks (dropped first, and recomputed, when the cache "
                 "runs short) but take no batch slot, so other sequences "
                 "keep the batch full while a tool runs.");
  schema->AddDouble("environment.park_kv_fraction",
                    &config->environment_park_kv_fraction, 0.0, 1.0,
                    "While episodes wait for their environment, new work is "
                    "admitted only while the KV cache is less full than "
                    "this fraction, so that admissions do not drop the "
                    "parked episodes' caches (which are then recomputed).");
  schema->AddStringList(
      "environment.turn_stop_strings", &config->environment_turn_stop_strings,
      "Texts that end a model turn as soon as the turn writes one (e.g. "
      "</tool_call>, so the call goes to the environment without waiting "
      "for the end-of-turn token); the turn keeps the tokens that wrote it. "
      "Besides stop tokens and EOS.");
  schema->AddEnum("environment.tool_call_format",
                  &config->environment_tool_call_format,
                  {"hermes", "qwen", "demo", "llama3"},
                  "How the model writes tool calls: hermes (<tool_call> "
                  "JSON blocks; also qwen, demo) or llama3. Used by "
                  "episodes and by the OpenAI endpoint, which parses a "
                  "chat request's answer into tool_calls when it sends "
                  "tools.");
  schema->AddString("environment.turn_end", &config->environment_turn_end,
                    "The chat template's end-of-turn text; observations "
                    "are rendered after its last occurrence (<|im_end|> "
                    "for Qwen and ChatML templates, <|eot_id|> for Llama "
                    "3).");
}

absl::Status Validate(const RolloutConfig& config) {
  if (!config.openai_harness_environment.empty() &&
      config.openai_listen.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "openai.harness_environment is '", config.openai_harness_environment,
        "' but openai.listen is empty: harnesses reach their episodes "
        "through the OpenAI endpoint"));
  }
  RETURN_IF_ERROR(model::CheckDeviceUsable("model.device", config.device));
  if (config.update_mode == "inplace" && config.device != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine.update_mode inplace needs model.device cpu, got ",
        config.device,
        ": the in-place receive buffer is host memory; use "
        "engine.update_mode staged on a GPU"));
  }
  RETURN_IF_ERROR(
      model::ParseDTypeName("model.dtype", config.dtype).status());
  if (config.update_mode == "inplace" && config.update_policy != "inflight") {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine.update_mode inplace needs engine.update_policy inflight, got ",
        config.update_policy,
        ": the receiver writes into the live weights, so the engine cannot "
        "keep decoding while it drains"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::rollout
