#pragma once

// CUDA IPC weight sync: the same-GPU/node catch-up path, the device-memory
// twin of shared_weight_segment.h. The trainer keeps the FULL payload of
// each of its newest K versions in a device allocation of its own
// (DeviceVersionRing) and exports a cudaIpcMemHandle_t for it; a worker on
// the same host asks for a version with FetchWeightsRequest.cuda_ipc (its
// host's boot id and its device), and the server answers with one
// WeightChunk carrying a CudaIpcOffer instead of the bytes. The worker
// checks the offer (ValidateCudaIpcOffer), opens the handle, copies the
// payload device-to-device, closes the handle and ends the call; the
// buffer stays alive until then even if newer versions push it out of the
// ring (the call holds a lease: a shared_ptr to the buffer).
//
// This header holds what does not need a device: the offer's checks, the
// ring and its leases, and the host's identity. cuda_ipc_device.h holds the
// CUDA runtime calls (allocation, export, open, copy).
//
// Token: each buffer carries kCudaIpcTokenBytes random bytes in the offer
// and, in device memory, right after the payload (at offset + size), so a
// client that opened a handle can check that the allocation it mapped is
// the one offered.
//
// Thread-safety: DeviceVersionRing is thread-safe; a DeviceWeightBuffer is
// immutable after creation and safe to share.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/trainer.pb.h"

namespace tandem::weights {

inline constexpr size_t kCudaIpcHandleBytes = 64;  // CUDA_IPC_HANDLE_SIZE
inline constexpr size_t kCudaIpcTokenBytes = 16;

// This host's /proc/sys/kernel/random/boot_id ("" when it cannot be read:
// such a process never offers nor asks).
std::string LocalBootId();

// `n` random bytes (getrandom).
std::string RandomIpcToken(size_t n = kCudaIpcTokenBytes);

// One version's FULL payload in device memory, exported for IPC. `memory`
// owns the allocation (its deleter frees it); `offer` describes it to a
// client (handle, offset, size, device, token).
struct DeviceWeightBuffer {
  uint64_t policy_version = 0;
  v1::CudaIpcOffer offer;
  std::shared_ptr<void> memory;
  // The payload's first byte (device memory), for whoever fills it.
  void* payload = nullptr;
};

// What a client can reach: its host and the devices its process sees
// (UUIDs, "GPU-..."), in CUDA's order.
struct CudaIpcLocalView {
  std::string boot_id;
  std::vector<std::string> device_uuids;
};

// Checks an offer against the version's manifest and the client's view:
// handle of kCudaIpcHandleBytes, token of kCudaIpcTokenBytes, size equal
// to the manifest's total_bytes, offset + size without overflow, the
// client's boot id, a device the client sees. Returns the index of the
// offer's device in local.device_uuids. InvalidArgument names the field
// and the value, e.g. "cuda_ipc.handle has 12 bytes, expected 64".
absl::StatusOr<int> ValidateCudaIpcOffer(const v1::CudaIpcOffer& offer,
                                         const v1::WeightManifest& manifest,
                                         const CudaIpcLocalView& local);

// Frees of device buffers, deferred to a thread that may block. cudaFree
// waits for the whole device, so a buffer whose last lease ends on a gRPC
// thread (a reactor's OnDone) must not be freed there: its deleter hands
// the free to Defer(), and the trainer's publishing thread runs it at its
// next DeviceVersionRing::Put (RunAll). Frees left at destruction run
// then; a free deferred after destruction (a lease outliving the ring and
// this object) runs at once. Thread-safe.
class DeferredFrees {
 public:
  ~DeferredFrees() { RunAll(); }
  void Defer(std::function<void()> free);
  // Runs the deferred frees on the calling thread.
  void RunAll();
  size_t pending() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::function<void()>> frees_ ABSL_GUARDED_BY(mu_);
};

// The trainer's newest `capacity` device payloads. Put() of a version
// evicts the oldest beyond capacity; an evicted buffer is freed once no
// lease (a shared_ptr from Offer) holds it: by Put itself when no lease
// holds it, else at a later Put (deferred_frees()).
class DeviceVersionRing {
 public:
  // REQUIRES: capacity >= 1.
  explicit DeviceVersionRing(size_t capacity);

  // Adds `buffer` (replacing one of the same version), then runs the
  // deferred frees (on the caller's thread: the trainer's).
  void Put(std::shared_ptr<const DeviceWeightBuffer> buffer);

  // The buffer the next Put would evict, taken out now for its memory to
  // be reused (FlattenModelToDevice's `reuse`) instead of allocating
  // another: the oldest buffer when the ring is full, its payload is
  // `payload_bytes` long and no lease holds it (none can begin once it is
  // out). Null otherwise, and the ring is unchanged. Until the next Put
  // the ring offers one version fewer (the one about to be evicted).
  std::shared_ptr<const DeviceWeightBuffer> TakeOldestForReuse(
      uint64_t payload_bytes);

  // Where buffers of this ring defer their frees
  // (AllocateDeviceWeightBuffer's `frees`).
  const std::shared_ptr<DeferredFrees>& deferred_frees() const {
    return frees_;
  }

  // A lease on `version` (exactly: policy versions start at 0) for a
  // client at `peer`: NotFound
  // when the ring does not hold it; FailedPrecondition when the client is
  // on another host (boot id differs or is empty), which cannot open it.
  absl::StatusOr<std::shared_ptr<const DeviceWeightBuffer>> Offer(
      uint64_t version, const v1::CudaIpcPeer& peer) const;

  size_t capacity() const { return capacity_; }
  // Versions held, oldest first.
  std::vector<uint64_t> versions() const;

 private:
  const size_t capacity_;
  const std::shared_ptr<DeferredFrees> frees_ =
      std::make_shared<DeferredFrees>();
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<const DeviceWeightBuffer>> buffers_
      ABSL_GUARDED_BY(mu_);
};

// A sink's copy of one version, handed over to go live from it
// (CudaIpcSink::TakeStagedCopy, device_go_live.h).
struct StagedIpcCopy {
  // Owns the copy (null: nothing handed over). Its deleter may run on any
  // thread (the engine's, when it drops the version's weights) and never
  // blocks on the device.
  std::shared_ptr<void> memory;
  uint64_t bytes = 0;
  // The CUDA index of the memory's device; -1: host memory (a sink that
  // stands in for a device in CPU tests).
  int device = -1;
  // kernels::Crc32c of `n` bytes at `d` inside the copy, computed where
  // the copy lies (the device CRC-32C kernel for device memory); null: the
  // host kernels::Crc32c (host memory only).
  std::function<absl::StatusOr<uint32_t>(const uint8_t* d, uint64_t n)> crc32c;
  // The tree root (tree_digest.h) of `n` bytes at `d` inside the copy, on
  // its device (kernels::cuda::Sha256TreeDevice); null: none (the plain
  // SHA-256 is checked instead).
  std::function<absl::StatusOr<std::string>(const uint8_t* d, uint64_t n)>
      tree_sha256;
};

// The worker's device side of the path (cuda_ipc_device.h implements it
// with the CUDA runtime). Called on the receiving thread only.
class CudaIpcSink {
 public:
  virtual ~CudaIpcSink() = default;
  // Where this process runs (sent as FetchWeightsRequest.cuda_ipc).
  virtual const v1::CudaIpcPeer& peer() const = 0;
  // What it can reach (for ValidateCudaIpcOffer).
  virtual const CudaIpcLocalView& local() const = 0;
  // Opens `offer` (validated; on local().device_uuids[device]), copies its
  // payload device-to-device into this sink's device staging buffer, checks
  // the token and closes the handle before returning. FailedPrecondition
  // when the handle does not open here or the token differs.
  virtual absl::Status CopyOffer(const v1::CudaIpcOffer& offer, int device) = 0;
  // Copies staged bytes [offset, offset + dst.size()) of the last
  // CopyOffer to host memory.
  virtual absl::Status ReadStaged(uint64_t offset, absl::Span<uint8_t> dst) = 0;
  // Hands the last CopyOffer's copy over (the device go-live of
  // GrpcPullReceiver's handoff mode): the caller owns it from now on, and
  // the next CopyOffer copies into another buffer, so a live version's
  // bytes are never overwritten. Empty (memory null) when nothing was
  // copied since the last take, or when this sink cannot hand copies over
  // (the default): the receiver then stages the copy through ReadStaged.
  virtual StagedIpcCopy TakeStagedCopy() { return {}; }
  // Whether TakeStagedCopy hands copies over.
  virtual bool hands_over() const { return false; }
};

}  // namespace tandem::weights
