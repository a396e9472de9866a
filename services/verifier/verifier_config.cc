#include "services/verifier/verifier_config.h"

#include "common/cluster/member_daemon.h"

namespace tandem::verifier {

void RegisterFields(config::ConfigSchema* schema, VerifierConfig* config) {
  config::AddServerOptions(schema, &config->server);
  cluster::AddCoordinatorAddress(schema, &config->coordinator_address);
  schema->AddInt("max_concurrency", &config->max_concurrency, 1, 100000,
                 "Items scored at once; a batch that would exceed it is "
                 "refused with RESOURCE_EXHAUSTED.");
  schema->AddInt("worker_threads", &config->worker_threads, 1, 256,
                 "Threads that run scorers.");
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
}

absl::Status Validate(const VerifierConfig& config) { return absl::OkStatus(); }

}  // namespace tandem::verifier
