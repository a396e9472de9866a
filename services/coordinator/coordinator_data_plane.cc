// The coordinator's data-plane secret (issue 25 item 3; proto
// DataPlaneSecret, docs/operations.md "Weight data plane").

#include <openssl/rand.h>

#include <string>

#include "common/base/logging.h"
#include "services/coordinator/coordinator.h"

namespace tandem::coordinator {

void Coordinator::RotateDataPlaneSecret(const std::string& why) {
  // Without TLS there is no private channel to hand a secret out on.
  if (!config_.server.tls.enabled()) return;
  std::string secret(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()),
                 static_cast<int>(secret.size())) != 1) {
    // Keep the current secret rather than hand out a guessable one.
    ComponentLogger("coordinator")->error("data-plane secret not rotated ({}): RAND_bytes failed", why);
    return;
  }
  uint64_t epoch = 0;
  {
    absl::MutexLock lock(&data_plane_mu_);
    epoch = data_plane_.epoch() + 1;
    data_plane_.set_epoch(epoch);
    data_plane_.set_secret(std::move(secret));
  }
  ComponentLogger("coordinator")->info("data-plane epoch {} ({})", epoch, why);
}

void Coordinator::FillDataPlaneSecret(tandem::v1::Role role,
                                      tandem::v1::DataPlaneSecret* out) {
  if (!config_.server.tls.enabled()) return;
  if (role != tandem::v1::ROLE_TRAINER && role != tandem::v1::ROLE_ROLLOUT) {
    return;
  }
  absl::MutexLock lock(&data_plane_mu_);
  *out = data_plane_;
}

}  // namespace tandem::coordinator
