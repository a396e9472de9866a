#pragma once

// What the device weight-sync tests share (weights_device_*_test.cc): a
// broadcast group that records what rank 0 sends and one that replays it
// to a receiving rank, host memory standing in for device memory, and
// device buffers for the GPU cases.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/broadcast/device_broadcast.h"
#include "kernels/bf16_delta.h"
#include "kernels/crc32c.h"
#include "kernels/cuda/bf16_delta_cuda.h"

// Catch last: it clashes with LibTorch's macros otherwise.
#include <catch2/catch.hpp>

namespace tandem::weights::testing {

using Bytes = std::vector<uint8_t>;

// Rank 0 of a group that claims device memory but runs on host bytes:
// records every broadcast, and which kind of call carried it.
class RecordingGroup : public BroadcastGroup {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  bool broken() const override { return false; }
  bool broadcasts_device_memory() const override { return true; }
  absl::Status Broadcast(absl::Span<uint8_t> bytes) override {
    record.emplace_back(bytes.begin(), bytes.end());
    from_device.push_back(false);
    return absl::OkStatus();
  }
  absl::Status BroadcastDevice(void* ptr, uint64_t bytes) override {
    const auto* p = static_cast<const uint8_t*>(ptr);
    record.emplace_back(p, p + bytes);
    from_device.push_back(true);
    return absl::OkStatus();
  }
  void Abort() override {}

  std::vector<Bytes> record;
  std::vector<bool> from_device;
};

// Plays a recording to a receiving rank, one broadcast after the other;
// with `device`, it also takes "device" broadcasts, into host memory.
class ReplayGroup : public BroadcastGroup {
 public:
  explicit ReplayGroup(std::vector<Bytes> record, bool device = false)
      : record_(std::move(record)), device_(device) {}
  int rank() const override { return 1; }
  int world_size() const override { return 2; }
  bool broken() const override { return false; }
  bool broadcasts_device_memory() const override { return device_; }
  absl::Status BroadcastDevice(void* ptr, uint64_t bytes) override {
    if (!device_) return BroadcastGroup::BroadcastDevice(ptr, bytes);
    return Broadcast({static_cast<uint8_t*>(ptr), bytes});
  }
  absl::Status Broadcast(absl::Span<uint8_t> bytes) override {
    if (next_ >= record_.size() || record_[next_].size() != bytes.size()) {
      return absl::DataLossError(
          absl::StrCat("replay: broadcast ", next_, " of ", bytes.size(),
                       " bytes, the recording has ",
                       next_ < record_.size() ? record_[next_].size() : 0));
    }
    std::memcpy(bytes.data(), record_[next_++].data(), bytes.size());
    return absl::OkStatus();
  }
  void Abort() override { aborted = true; }
  bool done() const { return next_ == record_.size(); }
  bool aborted = false;

 private:
  std::vector<Bytes> record_;
  bool device_;
  size_t next_ = 0;
};

// Host memory standing in for device memory in the device receiver.
class HostMemory : public DeviceMemory {
 public:
  absl::StatusOr<uint32_t> Crc32c(const uint8_t* d, uint64_t n) override {
    return kernels::Crc32c(d, n);
  }
  absl::Status ApplyDelta(absl::Span<const uint8_t> delta, uint8_t* d,
                          uint64_t n) override {
    return kernels::ApplyBf16Delta(
        delta, absl::MakeSpan(reinterpret_cast<uint16_t*>(d), n / 2));
  }
  absl::StatusOr<uint8_t*> Allocate(uint64_t n) override {
    ++allocations;
    return new uint8_t[n];
  }
  void Free(uint8_t* d) override { delete[] d; }
  int allocations = 0;
};

// A CUDA device is visible; else warns "skipping" (tests/gpu/run.sh reports
// the case SKIPPED).
inline bool Device() {
  if (kernels::cuda::DeviceAvailable()) return true;
  WARN("no CUDA device: skipping");
  return false;
}

// Device memory holding a copy of `host`, freed with the last owner.
inline std::shared_ptr<uint8_t> Upload(const Bytes& host) {
  void* d = nullptr;
  REQUIRE(cudaMalloc(&d, std::max<size_t>(host.size(), 1)) == cudaSuccess);
  REQUIRE(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(d),
                                  [](uint8_t* p) { cudaFree(p); });
}

inline Bytes Download(const uint8_t* d, size_t n) {
  Bytes host(n);
  REQUIRE(cudaMemcpy(host.data(), d, n, cudaMemcpyDeviceToHost) == cudaSuccess);
  return host;
}

}  // namespace tandem::weights::testing
