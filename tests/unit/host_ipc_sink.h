#pragma once

// Host-memory stand-ins for the device side of CUDA IPC (cuda_ipc.h), for
// CPU tests of the paths a GPU worker runs: HostAllocations plays the
// trainer's exported device allocations, HostIpcSink the worker's
// CudaIpcSink ("opens" a handle by looking it up among the allocations,
// as cudaIpcOpenMemHandle finds a live allocation; with hand_over it hands
// its copies over as host memory, as CudaIpcDeviceSink hands device
// memory over). A seam of a device, not a mock of a daemon.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/weights/cuda_ipc.h"

namespace tandem::weights::host_ipc {

using Bytes = std::vector<uint8_t>;

inline constexpr char kDevice[] = "GPU-00000000-1111-2222-3333-444444444444";

// Host-memory stand-ins for exported device allocations: handle -> memory
// (payload then token), held weakly as the CUDA driver holds nothing alive.
// Freed like AllocateDeviceWeightBuffer's: through `frees` when given.
class HostAllocations {
 public:
  std::shared_ptr<DeviceWeightBuffer> Allocate(
      uint64_t version, absl::Span<const uint8_t> bytes,
      std::shared_ptr<DeferredFrees> frees = nullptr) {
    const std::string token = RandomIpcToken();
    auto* memory = new Bytes(bytes.begin(), bytes.end());
    memory->insert(memory->end(), token.begin(), token.end());
    std::string handle(kCudaIpcHandleBytes, '\0');
    const uint64_t id = ++next_;
    std::memcpy(handle.data(), &id, sizeof(id));
    auto buffer = std::make_shared<DeviceWeightBuffer>();
    buffer->policy_version = version;
    buffer->offer.set_handle(handle);
    buffer->offer.set_size(bytes.size());
    buffer->offer.set_boot_id(LocalBootId());
    buffer->offer.set_device_uuid(kDevice);
    buffer->offer.set_pci_bus_id("0000:3b:00.0");
    buffer->offer.set_token(token);
    buffer->payload = memory->data();
    auto free = [this, memory] {
      delete memory;
      ++freed;
    };
    std::weak_ptr<DeferredFrees> defer = frees;
    buffer->memory =
        std::shared_ptr<void>(memory->data(), [free, defer](void*) {
          if (auto to = defer.lock()) {
            to->Defer(free);
          } else {
            free();
          }
        });
    live_[handle] = buffer->memory;
    return buffer;
  }
  // The memory behind `handle` while it is allocated.
  std::shared_ptr<void> Find(const std::string& handle) const {
    const auto it = live_.find(handle);
    return it == live_.end() ? nullptr : it->second.lock();
  }

  // Allocations actually freed (not merely released).
  std::atomic<int> freed{0};

 private:
  uint64_t next_ = 0;
  std::map<std::string, std::weak_ptr<void>> live_;
};

// A CudaIpcSink over HostAllocations: "opens" a handle only while its
// allocation lives, checks the token, copies into its staging vector.
class HostIpcSink final : public CudaIpcSink {
 public:
  explicit HostIpcSink(const HostAllocations* allocations)
      : allocations_(allocations) {
    peer_.set_boot_id(LocalBootId());
    peer_.set_device_uuid(kDevice);
    peer_.set_pci_bus_id("0000:3b:00.0");
    local_.boot_id = LocalBootId();
    local_.device_uuids = {kDevice};
  }
  const v1::CudaIpcPeer& peer() const override { return peer_; }
  const CudaIpcLocalView& local() const override { return local_; }
  absl::Status CopyOffer(const v1::CudaIpcOffer& offer, int device) override {
    ++copies;
    if (device != 0) return absl::InvalidArgumentError("device is not 0");
    std::shared_ptr<void> memory = allocations_->Find(offer.handle());
    if (memory == nullptr) {
      return absl::FailedPreconditionError("no such allocation");
    }
    const uint8_t* src =
        static_cast<const uint8_t*>(memory.get()) + offer.offset();
    if (std::memcmp(src + offer.size(), offer.token().data(),
                    kCudaIpcTokenBytes) != 0) {
      return absl::FailedPreconditionError("token differs");
    }
    // A new buffer each time, as the device sink copies after a take.
    staged_ = std::make_shared<Bytes>(src, src + offer.size());
    if (during_copy) during_copy();
    return absl::OkStatus();
  }
  absl::Status ReadStaged(uint64_t offset, absl::Span<uint8_t> dst) override {
    if (staged_ == nullptr || offset + dst.size() > staged_->size()) {
      return absl::OutOfRangeError("outside the staged copy");
    }
    std::memcpy(dst.data(), staged_->data() + offset, dst.size());
    return absl::OkStatus();
  }
  // With hand_over: the copy, in host memory (device -1, host CRC-32C),
  // as CudaIpcDeviceSink hands its device copy over.
  StagedIpcCopy TakeStagedCopy() override {
    if (!hand_over || staged_ == nullptr) return {};
    if (before_hand_over) before_hand_over(absl::MakeSpan(*staged_));
    StagedIpcCopy copy;
    copy.bytes = staged_->size();
    copy.memory = std::shared_ptr<void>(staged_, staged_->data());
    {
      std::lock_guard<std::mutex> lock(mu_);
      handed_over_.push_back(staged_);
    }
    staged_.reset();
    return copy;
  }
  bool hands_over() const override { return hand_over; }

  // Copies handed over and still owned by someone (the live weights).
  int held() const {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& c : handed_over_) n += c.expired() ? 0 : 1;
    return n;
  }
  size_t handed_over() const {
    std::lock_guard<std::mutex> lock(mu_);
    return handed_over_.size();
  }
  // The memory of the last copy handed over, while it lives.
  const uint8_t* last_handed_over() const {
    std::lock_guard<std::mutex> lock(mu_);
    auto last = handed_over_.empty() ? nullptr : handed_over_.back().lock();
    return last == nullptr ? nullptr : last->data();
  }

  bool hand_over = false;
  // Runs on the copy just before it is handed over (to corrupt it, as a
  // bad device copy would be).
  std::function<void(absl::Span<uint8_t>)> before_hand_over;
  std::atomic<int> copies{0};
  // Runs inside CopyOffer, while the server's call is open.
  std::function<void()> during_copy;

 private:
  const HostAllocations* allocations_;
  v1::CudaIpcPeer peer_;
  CudaIpcLocalView local_;
  std::shared_ptr<Bytes> staged_;
  mutable std::mutex mu_;
  std::vector<std::weak_ptr<Bytes>> handed_over_;  // guarded by mu_
};

}  // namespace tandem::weights::host_ipc
