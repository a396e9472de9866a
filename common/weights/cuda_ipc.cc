#include "common/weights/cuda_ipc.h"

#include <sys/random.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::weights {

std::string LocalBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

std::string RandomIpcToken(size_t n) {
  std::string token(n, '\0');
  size_t filled = 0;
  while (filled < n) {
    const ssize_t got = getrandom(token.data() + filled, n - filled, 0);
    if (got > 0) filled += static_cast<size_t>(got);
  }
  return token;
}

absl::StatusOr<int> ValidateCudaIpcOffer(const v1::CudaIpcOffer& offer,
                                         const v1::WeightManifest& manifest,
                                         const CudaIpcLocalView& local) {
  if (offer.handle().size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc.handle has ", offer.handle().size(),
                     " bytes, expected ", kCudaIpcHandleBytes));
  }
  if (offer.token().size() != kCudaIpcTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc.token has ", offer.token().size(),
                     " bytes, expected ", kCudaIpcTokenBytes));
  }
  if (offer.size() != manifest.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_ipc.size ", offer.size(), " does not match weights v",
        manifest.policy_version(), "'s total_bytes ", manifest.total_bytes()));
  }
  if (offer.offset() > std::numeric_limits<uint64_t>::max() - offer.size() -
                           kCudaIpcTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc.offset ",
                                                   offer.offset(), " + size ",
                                                   offer.size(), " overflows"));
  }
  if (local.boot_id.empty() || offer.boot_id() != local.boot_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc.boot_id '", absl::CHexEscape(offer.boot_id()),
                     "' is not this host's '", local.boot_id, "'"));
  }
  const auto it = std::find(local.device_uuids.begin(),
                            local.device_uuids.end(), offer.device_uuid());
  if (offer.device_uuid().empty() || it == local.device_uuids.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_ipc.device_uuid '", absl::CHexEscape(offer.device_uuid()),
        "' is not a device this process sees (",
        local.device_uuids.empty() ? "none"
                                   : absl::StrJoin(local.device_uuids, ", "),
        ")"));
  }
  return static_cast<int>(it - local.device_uuids.begin());
}

void DeferredFrees::Defer(std::function<void()> free) {
  absl::MutexLock lock(&mu_);
  frees_.push_back(std::move(free));
}

void DeferredFrees::RunAll() {
  std::vector<std::function<void()>> frees;
  {
    absl::MutexLock lock(&mu_);
    frees.swap(frees_);
  }
  for (auto& free : frees) free();
}

size_t DeferredFrees::pending() const {
  absl::MutexLock lock(&mu_);
  return frees_.size();
}

DeviceVersionRing::DeviceVersionRing(size_t capacity)
    : capacity_(std::max<size_t>(capacity, 1)) {}

void DeviceVersionRing::Put(std::shared_ptr<const DeviceWeightBuffer> buffer) {
  std::vector<std::shared_ptr<const DeviceWeightBuffer>> dropped;
  {
    absl::MutexLock lock(&mu_);
    bool replaced = false;
    for (auto& held : buffers_) {
      if (held->policy_version == buffer->policy_version) {
        dropped.push_back(std::exchange(held, std::move(buffer)));
        replaced = true;
        break;
      }
    }
    if (!replaced) {
      buffers_.push_back(std::move(buffer));
      std::sort(buffers_.begin(), buffers_.end(),
                [](const auto& a, const auto& b) {
                  return a->policy_version < b->policy_version;
                });
      while (buffers_.size() > capacity_) {
        dropped.push_back(std::move(buffers_.front()));
        buffers_.pop_front();
      }
    }
  }
  // What no lease holds is released here (its free deferred), then every
  // deferred free runs, outside the lock.
  dropped.clear();
  frees_->RunAll();
}

std::shared_ptr<const DeviceWeightBuffer> DeviceVersionRing::TakeOldestForReuse(
    uint64_t payload_bytes) {
  absl::MutexLock lock(&mu_);
  // Leases are copied only here, under mu_ (Offer): a count of 1 (the
  // ring's) cannot rise while it is held, nor once the buffer is out.
  if (buffers_.size() < capacity_ || buffers_.front().use_count() != 1 ||
      buffers_.front()->offer.size() != payload_bytes) {
    return nullptr;
  }
  std::shared_ptr<const DeviceWeightBuffer> oldest =
      std::move(buffers_.front());
  buffers_.pop_front();
  return oldest;
}

absl::StatusOr<std::shared_ptr<const DeviceWeightBuffer>>
DeviceVersionRing::Offer(uint64_t version, const v1::CudaIpcPeer& peer) const {
  absl::MutexLock lock(&mu_);
  if (buffers_.empty()) {
    return absl::NotFoundError("no version is held in device memory");
  }
  const std::shared_ptr<const DeviceWeightBuffer>* found = nullptr;
  for (const auto& held : buffers_) {
    if (held->policy_version == version) found = &held;
  }
  if (found == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("weights v", version, " is not held in device memory"));
  }
  if (peer.boot_id().empty() || peer.boot_id() != (*found)->offer.boot_id()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "client boot id '", absl::CHexEscape(peer.boot_id()),
        "' is not this host's: CUDA IPC handles open only on the same host"));
  }
  return *found;
}

std::vector<uint64_t> DeviceVersionRing::versions() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> out;
  for (const auto& held : buffers_) out.push_back(held->policy_version);
  return out;
}

}  // namespace tandem::weights
