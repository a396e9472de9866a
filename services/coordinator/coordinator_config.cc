#include "services/coordinator/coordinator_config.h"

#include "absl/strings/str_cat.h"

namespace tandem::coordinator {

void RegisterFields(config::ConfigSchema* schema, CoordinatorConfig* config) {
  config->server.grpc_address = "127.0.0.1:50051";
  config::AddServerOptions(schema, &config->server);
  schema->AddInt("heartbeat_interval_ms", &config->heartbeat_interval_ms, 10,
                 600000, "How often members heartbeat, in milliseconds.");
  schema->AddInt("heartbeat_timeout_ms", &config->heartbeat_timeout_ms, 20,
                 3600000,
                 "A member silent this long (ms) is declared dead and its "
                 "leases return to the queue.");
  schema->AddInt("member_retention_ms", &config->member_retention_ms, 0,
                 86400000,
                 "Dead and departed members stay visible in status this "
                 "long (ms).");
  schema->AddInt("group_size", &config->group_size, 1, 1024,
                 "Samples generated per prompt (GRPO group size).");
  schema->AddInt("max_lag", &config->max_lag, 0, 1000,
                 "Staleness bound: the most policy versions a trained token "
                 "may lag behind the trainer.");
  schema->AddInt("lease_timeout_ms", &config->lease_timeout_ms, 100, 86400000,
                 "A prompt lease expires this long (ms) after it was granted "
                 "or renewed; its prompt is then leased again.");

  DatasetOptions& d = config->dataset;
  schema->AddEnum("dataset.kind", &d.kind, {"builtin_arith", "jsonl"},
                  "Prompt source: the built-in arithmetic task or a JSONL "
                  "file.");
  schema->AddString("dataset.path", &d.path,
                    "JSONL dataset, one prompt per line (kind jsonl).");
  schema->AddString("dataset.tokenizer", &d.tokenizer,
                    "tokenizer.json for JSONL lines given as prompt text.");
  schema->AddEnum("dataset.bad_lines", &d.bad_lines, {"skip", "refuse"},
                  "Malformed JSONL lines are skipped (and logged) or refuse "
                  "the dataset.");
  schema->AddInt("dataset.epochs", &d.epochs, 0, 1000000,
                 "Passes over a JSONL dataset; 0 = unbounded.");
  schema->AddInt("dataset.seed", &d.seed, 0, INT64_MAX,
                 "Seed of epoch shuffling and of the built-in generator.");
  schema->AddBool("dataset.shuffle", &d.shuffle,
                  "Shuffle each JSONL epoch (seeded).");
  schema->AddInt("dataset.arith_digits", &d.arith_digits, 1, 18,
                 "Built-in task: digits of each operand.");
  schema->AddBool("dataset.arith_subtraction", &d.arith_subtraction,
                  "Built-in task: include subtraction problems.");
  schema->AddBool("dataset.add_bos", &d.add_bos,
                  "Built-in task: prompt token ids start with <|bos|>.");

  SamplingOptions& s = config->sampling;
  schema->AddDouble("sampling.temperature", &s.temperature, 0.0, 100.0,
                    "Softmax temperature of every lease; 0 = greedy.");
  schema->AddDouble("sampling.top_p", &s.top_p, 0.0, 1.0,
                    "Nucleus sampling mass; 1 disables it.");
  schema->AddInt("sampling.top_k", &s.top_k, 0, 1000000,
                 "Top-k sampling; 0 disables it.");
  schema->AddInt("sampling.max_tokens", &s.max_tokens, 0, 1000000,
                 "Generated tokens per sample; 0 = a default for the "
                 "dataset.");

  ScoringOptions& sc = config->scoring;
  schema->AddInt("scoring.batch_size", &sc.batch_size, 1, 100000,
                 "Samples per ScoreBatch call to a verifier.");
  schema->AddInt("scoring.batch_wait_ms", &sc.batch_wait_ms, 0, 60000,
                 "How long a partial scoring batch waits to fill (ms).");
  schema->AddInt("scoring.timeout_ms", &sc.timeout_ms, 10, 3600000,
                 "Deadline of each ScoreBatch call (ms).");
  schema->AddInt("scoring.concurrency", &sc.concurrency, 1, 256,
                 "Concurrent ScoreBatch calls per verifier name.");
  schema->AddInt("scoring.retry_backoff_ms", &sc.retry_backoff_ms, 1, 60000,
                 "Wait after a failed ScoreBatch call before retrying (ms).");
  schema->AddInt("scoring.unroutable_timeout_ms", &sc.unroutable_timeout_ms, 0,
                 86400000,
                 "How long a sample waits for a live verifier replica serving "
                 "its verifier before it is scored 0 as no_verifier (ms); 0 "
                 "= wait forever.");

  TrainingOptions& t = config->training;
  schema->AddInt("training.batch_timeout_ms", &t.batch_timeout_ms, 10, 86400000,
                 "A training batch not committed within this time (ms) is "
                 "handed out again.");
  schema->AddEnum("training.stale_groups", &t.stale_groups, {"drop", "keep"},
                  "Ready groups beyond max_lag for the trainer are dropped "
                  "(counted; their prompts are generated again) or kept for "
                  "importance-sampling correction.");
  schema->AddInt("training.groups_per_version", &t.groups_per_version, 1,
                 1000000,
                 "Dispatch throttle: expected groups per trainer step; a "
                 "worker lag versions behind is leased work only while "
                 "fewer than max(max_lag - lag, 1) times this many groups "
                 "are in flight.");

  schema->AddString("journal.dir", &config->journal.dir,
                    "Directory of the coordinator's journal, so a restart "
                    "continues where it stopped; empty = no journal.");
  schema->AddInt("journal.compact_bytes", &config->journal.compact_bytes, 4096,
                 INT64_MAX,
                 "Compact the journal when it grows past this many bytes.");

  WeightSyncOptions& w = config->weight_sync;
  schema->AddBool("weight_sync.broadcast", &w.broadcast,
                  "Form weight broadcast groups (membership epochs) of the "
                  "trainer and caught-up rollout workers; off = every worker "
                  "pulls.");
  schema->AddInt("weight_sync.report_timeout_ms", &w.report_timeout_ms, 10,
                 3600000,
                 "A rollout worker joins the next broadcast epoch only if it "
                 "reported within this time (ms); workers are told and "
                 "report at least twice per interval.");
  schema->AddEnum("weight_sync.backend", &w.backend, {"gloo", "nccl"},
                  "Transport of the broadcast groups: gloo (CPU) or nccl "
                  "(GPU; only in builds with TANDEM_ENABLE_NCCL, refused at "
                  "start otherwise). A trainer or rollout worker that cannot "
                  "run it (no CUDA device) logs an error and receives or "
                  "serves every version by pull instead.");
  schema->AddInt("weight_sync.regroup_wait_ms", &w.regroup_wait_ms, 0, 3600000,
                 "After a failed broadcast the next epoch is formed at once "
                 "to re-send the version, when every other member of the "
                 "failed epoch reported leaving it, or after this long "
                 "without the silent ones (ms).");
}

absl::Status Validate(const CoordinatorConfig& config) {
  if (config.heartbeat_timeout_ms < 2 * config.heartbeat_interval_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_timeout_ms must be at least twice heartbeat_interval_ms (",
        config.heartbeat_interval_ms, "), got ", config.heartbeat_timeout_ms));
  }
  if (config.lease_timeout_ms < config.heartbeat_interval_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease_timeout_ms must be at least heartbeat_interval_ms (",
        config.heartbeat_interval_ms, "), got ", config.lease_timeout_ms));
  }
  if (config.dataset.kind == "jsonl" && config.dataset.path.empty()) {
    return absl::InvalidArgumentError(
        "dataset.path must name a JSONL file when dataset.kind is jsonl");
  }
  if (config.weight_sync.backend == "nccl" && !TANDEM_ENABLE_NCCL) {
    return absl::InvalidArgumentError(
        "weight_sync.backend: nccl: this build has no NCCL transport "
        "(TANDEM_ENABLE_NCCL is off); use weight_sync.backend: gloo or a "
        "build with CUDA and NCCL");
  }
  return absl::OkStatus();
}

}  // namespace tandem::coordinator
