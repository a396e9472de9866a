#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"

namespace tandem::coordinator {

// Where prompts come from (YAML section `dataset`).
struct DatasetOptions {
  // "builtin_arith": the built-in arithmetic task (common/task);
  // "jsonl": a JSONL file, one prompt per line.
  std::string kind = "builtin_arith";
  // JSONL file (kind jsonl).
  std::string path;
  // tokenizer.json used to tokenize `prompt` text of JSONL lines. Lines that
  // carry `prompt_token_ids` need none.
  std::string tokenizer;
  // What a malformed JSONL line does: "skip" (logged with file and line) or
  // "refuse" (the coordinator does not start).
  std::string bad_lines = "skip";
  // Passes over the dataset; 0 = unbounded. The built-in task is an
  // unbounded stream and ignores it.
  int64_t epochs = 0;
  // Seed of the shuffling (JSONL, per epoch) and of the built-in generator.
  int64_t seed = 0;
  // Shuffle each JSONL epoch (otherwise file order).
  bool shuffle = true;
  // Built-in task: operand digits and whether to include subtraction.
  int64_t arith_digits = 3;
  bool arith_subtraction = false;
  // Built-in task: prepend <|bos|> to the prompt token ids.
  bool add_bos = true;
};

// Sampling parameters sent with every lease (YAML section `sampling`).
struct SamplingOptions {
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  // Generated tokens per sample; 0 = the built-in task's answer length plus
  // the end token (digits + 3), or 256 for JSONL datasets.
  int64_t max_tokens = 0;
};

// Scoring of samples by verifier members (YAML section `scoring`).
struct ScoringOptions {
  // Items per ScoreBatch call.
  int64_t batch_size = 64;
  // How long a partial batch waits for more items, in milliseconds.
  int64_t batch_wait_ms = 5;
  // Deadline of each ScoreBatch call.
  int64_t timeout_ms = 10000;
  // Concurrent ScoreBatch calls per verifier name (dispatcher threads).
  int64_t concurrency = 2;
  // Backoff after a failed call before the items are tried again.
  int64_t retry_backoff_ms = 100;
  // How long a sample waits for a live verifier replica that serves its
  // verifier name before it is scored 0 with outcome "no_verifier"; 0 waits
  // forever.
  int64_t unroutable_timeout_ms = 0;
};

// Training batches and the staleness bound (YAML section `training`).
struct TrainingOptions {
  // A pulled batch not committed within this time is handed out again.
  int64_t batch_timeout_ms = 300000;
  // Ready groups older than max_lag for the trainer: "drop" (counted) or
  // "keep" (handed out anyway; the trainer corrects by importance sampling).
  std::string stale_groups = "drop";
  // Dispatch throttle: groups the trainer consumes per version (refined by
  // the trainer's pulls; see GroupLedger). The trainer's own default batch
  // (training.batch_max_groups) is 16: a larger start over-dispatches
  // until its first pull, and that work goes stale.
  int64_t groups_per_version = 16;
};

// Durability (YAML section `journal`).
struct JournalOptions {
  // Directory of the journal; empty runs without one (state is lost on
  // restart).
  std::string dir;
  // The journal is compacted when it grows past this many bytes.
  int64_t compact_bytes = 64 << 20;
};

// Weight sync by broadcast (YAML section `weight_sync`): the coordinator
// owns the broadcast group as membership epochs (broadcast_epochs.h).
struct WeightSyncOptions {
  // Form broadcast groups; off = every rollout worker pulls.
  bool broadcast = true;
  // A rollout worker joins the next epoch only if its last SyncWeightGroup
  // report is at most this old.
  int64_t report_timeout_ms = 2000;
  // Transport of the broadcast groups (BroadcastGroup.backend): "gloo", or
  // "nccl" in builds with TANDEM_ENABLE_NCCL (Validate() refuses it
  // otherwise). Members create the group with
  // weights::CreateBroadcastGroup.
  std::string backend = "gloo";
  // After the trainer reports a failed broadcast, the next epoch is formed
  // (to re-send the version) once the failed epoch's other members
  // reported leaving it, or after this long without the silent ones.
  int64_t regroup_wait_ms = 500;
};

struct CoordinatorConfig {
  config::ServerOptions server;
  // Members heartbeat this often.
  int64_t heartbeat_interval_ms = 1000;
  // A member silent this long is declared dead and its leases reclaimed.
  int64_t heartbeat_timeout_ms = 5000;
  // Dead and departed members stay visible in status this long.
  int64_t member_retention_ms = 300000;
  // Samples per prompt.
  int64_t group_size = 8;
  // Staleness bound in policy versions.
  int64_t max_lag = 4;
  // A lease expires this long after it was granted or last renewed.
  int64_t lease_timeout_ms = 60000;
  DatasetOptions dataset;
  SamplingOptions sampling;
  ScoringOptions scoring;
  TrainingOptions training;
  JournalOptions journal;
  WeightSyncOptions weight_sync;
};

void RegisterFields(config::ConfigSchema* schema, CoordinatorConfig* config);
absl::Status Validate(const CoordinatorConfig& config);

}  // namespace tandem::coordinator
