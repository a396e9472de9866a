#include "services/verifier/verifier_config.h"

#include "absl/strings/str_cat.h"
#include "common/cluster/member_daemon.h"

namespace tandem::verifier {

void RegisterFields(config::ConfigSchema* schema, VerifierConfig* config) {
  config::AddServerOptions(schema, &config->server);
  cluster::AddCoordinatorAddress(schema, &config->coordinator_address);
  schema->AddInt("max_concurrency", &config->max_concurrency, 1, 100000,
                 "Items admitted at once (being scored or waiting for a "
                 "thread); a batch that would exceed it is refused with "
                 "RESOURCE_EXHAUSTED.");
  schema->AddInt("max_batch_items", &config->max_batch_items, 1, 100000,
                 "Items in one ScoreBatch call; a larger batch is refused "
                 "with RESOURCE_EXHAUSTED. At most max_concurrency.");
  schema->AddInt("worker_threads", &config->worker_threads, 1, 256,
                 "Items scored in parallel (one thread each; batches share "
                 "them round robin).");
  schema->AddInt("item_timeout_ms", &config->item_timeout_ms, 10, 3600000,
                 "Deadline of one item once started: its running program is "
                 "killed and it scores 0 (timeout). A batch's deadline is its "
                 "caller's gRPC deadline.");
  schema->AddStringList("verifiers", &config->verifiers,
                        "Verifier names this replica serves (advertised to "
                        "the coordinator for routing); empty = all.");
  schema->AddInt("code.cpu_seconds", &config->code_cpu_seconds, 1, 3600,
                 "CPU-time limit of one sandboxed program run.");
  schema->AddDouble("code.wall_seconds", &config->code_wall_seconds, 0.1, 3600,
                    "Wall-clock limit of one sandboxed program run.");
  schema->AddInt("code.address_space_bytes", &config->code_address_space_bytes,
                 16 << 20, int64_t{1} << 40,
                 "Address-space limit of a sandboxed program.");
  schema->AddInt("code.max_output_bytes", &config->code_max_output_bytes, 1024,
                 int64_t{1} << 30,
                 "Output captured per stream; more kills the program.");
  schema->AddInt("code.max_processes", &config->code_max_processes, 1, 4096,
                 "Process limit of the sandbox user.");
  schema->AddBool("code.allow_network_fallback",
                  &config->code_allow_network_fallback,
                  "Run code without a private network namespace when the "
                  "kernel refuses one (unsafe; off refuses to run code).");
  schema->AddBool("code.private_filesystem", &config->code_private_filesystem,
                  "Give each run a private read-only filesystem view (mount "
                  "namespace) where the kernel allows it.");
  RegisterEnvironmentFields(schema, &config->environment);
}

absl::Status Validate(const VerifierConfig& config) {
  if (config.max_batch_items > config.max_concurrency) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_batch_items (", config.max_batch_items,
        ") must be at most max_concurrency (", config.max_concurrency,
        "): a full batch could never be admitted"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::verifier
