// CreateBroadcastGroup(): the backend named by the coordinator's
// BroadcastGroup picks the transport (broadcast_group.h).

#include "absl/strings/str_cat.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#if TANDEM_ENABLE_NCCL
#include "common/weights/broadcast/nccl_broadcast_transport.h"
#endif

namespace tandem::weights {
namespace {

std::string BackendName(absl::string_view backend) {
  return backend.empty() ? std::string("gloo") : std::string(backend);
}

}  // namespace

bool BroadcastBackendBuilt(absl::string_view backend) {
  const std::string name = BackendName(backend);
  if (name == "gloo") return true;
  return name == "nccl" && TANDEM_ENABLE_NCCL;
}

absl::StatusOr<std::unique_ptr<BroadcastGroup>> CreateBroadcastGroup(
    const BroadcastGroupConfig& config, const GlooRendezvousStore* server) {
  const std::string name = BackendName(config.backend);
  if (name == "gloo") {
    absl::StatusOr<std::unique_ptr<GlooBroadcastGroup>> group =
        GlooBroadcastGroup::Create(config, server);
    if (!group.ok()) return group.status();
    return std::unique_ptr<BroadcastGroup>(*std::move(group));
  }
  if (name == "nccl") {
#if TANDEM_ENABLE_NCCL
    NcclGroupConfig nccl;
    static_cast<BroadcastGroupConfig&>(nccl) = config;
    absl::StatusOr<std::unique_ptr<NcclBroadcastGroup>> group =
        NcclBroadcastGroup::Create(nccl);
    if (!group.ok()) {
      if (group.status().code() == absl::StatusCode::kFailedPrecondition) {
        return absl::FailedPreconditionError(absl::StrCat(
            "weight_sync.backend 'nccl': ", group.status().message()));
      }
      return group.status();
    }
    return std::unique_ptr<BroadcastGroup>(*std::move(group));
#else
    return absl::FailedPreconditionError(
        "weight_sync.backend 'nccl': this build has no NCCL "
        "(TANDEM_ENABLE_NCCL is off)");
#endif
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "weight_sync.backend '", name, "': unknown to this build (it has gloo",
      TANDEM_ENABLE_NCCL ? " and nccl)" : ")"));
}

absl::Status RefuseBroadcastGroup(const BroadcastGroupConfig& config,
                                  absl::string_view reason) {
#if TANDEM_ENABLE_NCCL
  if (BackendName(config.backend) == "nccl") {
    NcclGroupConfig nccl;
    static_cast<BroadcastGroupConfig&>(nccl) = config;
    return NcclRefuseGroup(nccl, reason);
  }
#endif
  (void)config;
  (void)reason;
  return absl::OkStatus();
}

}  // namespace tandem::weights
