#include "common/weights/broadcast/broadcast_group.h"

#include "absl/strings/str_cat.h"
#include "common/weights/broadcast/broadcast_protocol.h"

namespace tandem::weights {

absl::Status BroadcastGroup::BroadcastDevice(void* /*device_ptr*/,
                                             uint64_t bytes) {
  return absl::FailedPreconditionError(absl::StrCat(
      "broadcast group rank ", rank(), "/", world_size(),
      ": this backend cannot broadcast device memory (", bytes,
      " bytes asked); use the nccl backend, or copy the bytes to the host "
      "and call Broadcast()"));
}

absl::Status BroadcastWeightSender::Publish(const v1::WeightManifest& manifest,
                                            absl::Span<const uint8_t> payload,
                                            absl::Time /*deadline*/) {
  return PublishOverBroadcast(
      [this](absl::Span<uint8_t> b) { return group_->Broadcast(b); }, manifest,
      payload, group_->piece_bytes(), keys_,
      [this](absl::Span<uint8_t> b) { return group_->StartBroadcast(b); });
}

absl::StatusOr<uint64_t> BroadcastWeightReceiver::ReceiveNext(
    StagingWeights* staging, absl::Time /*deadline*/) {
  return ReceiveOverBroadcast(
      [this](absl::Span<uint8_t> b) { return group_->StartBroadcast(b); },
      [this] { group_->Abort(); }, staging, &last_round_version_, trusted_,
      keys_, &last_seal_);
}

}  // namespace tandem::weights
