#pragma once

// The CUDA runtime side of CUDA IPC weight sync (cuda_ipc.h): the
// trainer's exported device buffers and the worker's sink. Compiled in
// every build (the torch wheel's cudart, target tandem_cudart); used only
// by processes on a CUDA device. Every call names the CUDA error it met.
//
// Thread-safety: the functions may be called from any thread (each sets
// the device it works on); a CudaIpcDeviceSink is used by one receiving
// thread.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/weights/cuda_ipc.h"

struct CUstream_st;  // cudaStream_t, without the CUDA headers

namespace tandem::weights {

// The identity of CUDA device `device` of this process: boot id, UUID
// ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx") and PCI bus id.
absl::StatusOr<v1::CudaIpcPeer> CudaIpcPeerOf(int device);

// The devices this process sees, with the host's boot id.
absl::StatusOr<CudaIpcLocalView> LocalCudaIpcView();

// A new device allocation on `device` for a payload of `payload_bytes`
// bytes of `policy_version`, exported with cudaIpcGetMemHandle, its token
// written after the payload. The caller fills `payload` (device memory)
// before the buffer is offered. Freed with cudaFree when the last
// reference goes: through `frees` when given (a DeviceVersionRing's
// deferred_frees(): the free runs on the ring's Put thread), else there.
absl::StatusOr<std::shared_ptr<DeviceWeightBuffer>> AllocateDeviceWeightBuffer(
    int device, uint64_t policy_version, uint64_t payload_bytes,
    std::shared_ptr<DeferredFrees> frees = nullptr);

// A CudaIpcSink on `device` (this process's CUDA index): a device staging
// buffer grown to the largest payload copied. TakeStaged() or
// TakeStagedCopy() hands the buffer of the last copy over (to go live
// from it, device_go_live.h); the next CopyOffer then copies into another
// allocation, so a live version's bytes are never overwritten.
//
// Pool: a buffer handed over comes back to the sink when its last owner
// drops it (the live weights of a version the engine swapped out): its
// deleter records a CUDA event on the legacy default stream of the
// buffer's device and puts the buffer and event on a free list (no
// cudaFree, no wait: it never blocks the engine's thread). The next
// CopyOffer reuses a free buffer large enough instead of calling
// cudaMalloc: its copy stream (non-blocking, the sink's own) waits for that
// event on the device, so kernels queued before the owner dropped it
// finish reading before the copy overwrites it, and the receiving thread
// never synchronizes the whole device. REQUIRES: the readers of a
// handed-over buffer run on the legacy default stream (LibTorch's default
// stream, the engine's) or on blocking streams, which that stream waits
// for; a reader on a non-blocking stream must finish before it drops its
// last reference. When the event cannot be recorded, the reuse falls back
// to cudaDeviceSynchronize. At most kMaxFreeBuffers stay on the list;
// CopyOffer frees the rest, and the destructor every buffer not handed
// over (one still owned is freed by its last owner then).
class CudaIpcDeviceSink final : public CudaIpcSink {
 public:
  static constexpr size_t kMaxFreeBuffers = 2;

  static absl::StatusOr<std::unique_ptr<CudaIpcDeviceSink>> Create(int device);
  ~CudaIpcDeviceSink() override;

  const v1::CudaIpcPeer& peer() const override { return peer_; }
  const CudaIpcLocalView& local() const override { return local_; }
  absl::Status CopyOffer(const v1::CudaIpcOffer& offer, int device) override;
  absl::Status ReadStaged(uint64_t offset, absl::Span<uint8_t> dst) override;
  // The copy with the device CRC-32C (kernels::cuda::Crc32cDevice); only
  // in builds with the CUDA kernels (TANDEM_ENABLE_CUDA): elsewhere
  // hands_over() is false and the receiver stages through ReadStaged.
  StagedIpcCopy TakeStagedCopy() override;
  bool hands_over() const override;

  // The staged payload of the last CopyOffer (device memory on device()).
  const void* staged() const { return staging_.get(); }
  // The allocation holding the last CopyOffer's payload (staged_bytes()
  // bytes at its start; back to the pool when the last owner drops it),
  // given up by the sink (staged() is null and staged_bytes() 0 after it:
  // read them first); null when nothing was copied since the last take.
  std::shared_ptr<void> TakeStaged();
  uint64_t staged_bytes() const { return staged_bytes_; }
  int device() const { return device_; }
  // cudaMalloc calls made for staging buffers so far (the pool's test).
  uint64_t allocations() const { return allocations_; }

 private:
  class Pool;

  CudaIpcDeviceSink(int device, v1::CudaIpcPeer peer, CudaIpcLocalView local,
                    CUstream_st* copy_stream);

  const int device_;
  const v1::CudaIpcPeer peer_;
  const CudaIpcLocalView local_;
  const std::shared_ptr<Pool> pool_;
  // cudaStream_t on device_ (non-blocking) that CopyOffer copies on.
  CUstream_st* const copy_stream_;
  std::shared_ptr<void> staging_;
  uint64_t capacity_ = 0;
  uint64_t staged_bytes_ = 0;
  uint64_t allocations_ = 0;
};

// Whether this process sees a CUDA device (false without a driver).
bool CudaIpcDeviceVisible();

// Waits for every copy queued on `device` (all streams) to finish.
absl::Status FinishDeviceWrites(int device);

}  // namespace tandem::weights
