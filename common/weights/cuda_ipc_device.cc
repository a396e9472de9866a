#include "common/weights/cuda_ipc_device.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

#if TANDEM_ENABLE_CUDA
#include "kernels/cuda/crc32c_cuda.h"
#include "kernels/cuda/sha256_tree_cuda.h"
#endif

namespace tandem::weights {
namespace {

absl::Status CudaError(cudaError_t error, const char* what) {
  return absl::UnavailableError(absl::StrCat(what, ": ",
                                             cudaGetErrorName(error), " (",
                                             cudaGetErrorString(error), ")"));
}

#define TANDEM_CUDA_RETURN(call, what) \
  do {                                 \
    const cudaError_t _e = (call);     \
    if (_e != cudaSuccess) {           \
      (void)cudaGetLastError();        \
      return CudaError(_e, what);      \
    }                                  \
  } while (0)

std::string UuidString(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  return absl::StrFormat(
      "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%"
      "02x",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
      b[12], b[13], b[14], b[15]);
}

}  // namespace

bool CudaIpcDeviceVisible() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

absl::Status FinishDeviceWrites(int device) {
  TANDEM_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
  TANDEM_CUDA_RETURN(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return absl::OkStatus();
}

absl::StatusOr<v1::CudaIpcPeer> CudaIpcPeerOf(int device) {
  cudaDeviceProp prop;
  TANDEM_CUDA_RETURN(cudaGetDeviceProperties(&prop, device),
                     "cudaGetDeviceProperties");
  char bus[32] = {0};
  TANDEM_CUDA_RETURN(cudaDeviceGetPCIBusId(bus, sizeof(bus), device),
                     "cudaDeviceGetPCIBusId");
  v1::CudaIpcPeer peer;
  peer.set_boot_id(LocalBootId());
  peer.set_device_uuid(UuidString(prop.uuid));
  peer.set_pci_bus_id(bus);
  return peer;
}

absl::StatusOr<CudaIpcLocalView> LocalCudaIpcView() {
  int count = 0;
  TANDEM_CUDA_RETURN(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  CudaIpcLocalView view;
  view.boot_id = LocalBootId();
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    TANDEM_CUDA_RETURN(cudaGetDeviceProperties(&prop, d),
                       "cudaGetDeviceProperties");
    view.device_uuids.push_back(UuidString(prop.uuid));
  }
  return view;
}

absl::StatusOr<std::shared_ptr<DeviceWeightBuffer>> AllocateDeviceWeightBuffer(
    int device, uint64_t policy_version, uint64_t payload_bytes,
    std::shared_ptr<DeferredFrees> frees) {
  auto peer = CudaIpcPeerOf(device);
  if (!peer.ok()) return peer.status();
  TANDEM_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
  void* base = nullptr;
  TANDEM_CUDA_RETURN(cudaMalloc(&base, payload_bytes + kCudaIpcTokenBytes),
                     "cudaMalloc of a device weight buffer");
  auto free = [device](void* p) {
    cudaSetDevice(device);
    cudaFree(p);
  };
  // The deferred free holds `frees` only weakly: a lease that outlives the
  // ring (and its DeferredFrees) frees at once.
  std::weak_ptr<DeferredFrees> defer = frees;
  std::shared_ptr<void> memory(base, [free, defer](void* p) {
    if (std::shared_ptr<DeferredFrees> to = defer.lock()) {
      to->Defer([free, p] { free(p); });
    } else {
      free(p);
    }
  });
  const std::string token = RandomIpcToken();
  auto* bytes = static_cast<uint8_t*>(base);
  TANDEM_CUDA_RETURN(cudaMemcpy(bytes + payload_bytes, token.data(),
                                token.size(), cudaMemcpyHostToDevice),
                     "writing the buffer's token");
  cudaIpcMemHandle_t handle;
  TANDEM_CUDA_RETURN(cudaIpcGetMemHandle(&handle, base), "cudaIpcGetMemHandle");
  auto buffer = std::make_shared<DeviceWeightBuffer>();
  buffer->policy_version = policy_version;
  buffer->offer.set_handle(std::string(handle.reserved, sizeof(handle)));
  buffer->offer.set_offset(0);
  buffer->offer.set_size(payload_bytes);
  buffer->offer.set_boot_id(peer->boot_id());
  buffer->offer.set_device_uuid(peer->device_uuid());
  buffer->offer.set_pci_bus_id(peer->pci_bus_id());
  buffer->offer.set_token(token);
  buffer->memory = std::move(memory);
  buffer->payload = base;
  return buffer;
}

// Staging buffers handed over and dropped by their last owner, for the
// next CopyOffer (cuda_ipc_device.h, "Pool"). Thread-safe: Return runs in
// the deleters, on any thread; the rest on the sink's receiving thread.
class CudaIpcDeviceSink::Pool {
 public:
  // A free buffer: `released` completes when the work queued before its
  // last owner dropped it has run (null: it could not be recorded).
  struct Free {
    void* memory = nullptr;
    uint64_t capacity = 0;
    cudaEvent_t released = nullptr;
  };

  explicit Pool(int device) : device_(device) {}
  ~Pool() { Trim(0); }

  // An allocation of `capacity` bytes whose owner (pool or not) frees it:
  // back to this pool while it lives, else cudaFree.
  static std::shared_ptr<void> Own(const std::shared_ptr<Pool>& pool, void* p,
                                   uint64_t capacity) {
    std::weak_ptr<Pool> home = pool;
    const int device = pool->device_;
    return std::shared_ptr<void>(p, [home, device, capacity](void* q) {
      if (std::shared_ptr<Pool> to = home.lock()) {
        to->Return(q, capacity);
      } else {
        cudaSetDevice(device);
        cudaFree(q);
      }
    });
  }

  // Records the release event on the legacy default stream of the pool's
  // device (never waits) and lists the buffer. The calling thread's
  // current device is left as it was.
  void Return(void* p, uint64_t capacity) {
    int current = -1;
    const bool had_device = cudaGetDevice(&current) == cudaSuccess;
    Free free{p, capacity, nullptr};
    if (cudaSetDevice(device_) != cudaSuccess ||
        cudaEventCreateWithFlags(&free.released, cudaEventDisableTiming) !=
            cudaSuccess) {
      free.released = nullptr;
    } else if (cudaEventRecord(free.released, cudaStreamLegacy) !=
               cudaSuccess) {
      cudaEventDestroy(free.released);
      free.released = nullptr;
    }
    (void)cudaGetLastError();
    if (had_device && current != device_) cudaSetDevice(current);
    Put(free);
  }

  void Put(const Free& free) {
    absl::MutexLock lock(&mu_);
    free_.push_back(free);
  }

  // The smallest free buffer of at least `bytes` bytes, taken off the
  // list (its event now the caller's); memory null when none is.
  Free Take(uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].capacity >= bytes &&
          (best == free_.size() || free_[i].capacity < free_[best].capacity)) {
        best = i;
      }
    }
    if (best == free_.size()) return {};
    const Free taken = free_[best];
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    return taken;
  }

  // Frees all but the `keep` most recently returned buffers (cudaFree
  // waits for the device: the receiving thread only).
  void Trim(size_t keep) {
    std::vector<Free> freed;
    {
      absl::MutexLock lock(&mu_);
      if (free_.size() <= keep) return;
      const auto cut = free_.end() - static_cast<std::ptrdiff_t>(keep);
      freed.assign(free_.begin(), cut);
      free_.erase(free_.begin(), cut);
    }
    cudaSetDevice(device_);
    for (const Free& f : freed) {
      if (f.released != nullptr) cudaEventDestroy(f.released);
      cudaFree(f.memory);
    }
  }

 private:
  const int device_;
  absl::Mutex mu_;
  std::vector<Free> free_ ABSL_GUARDED_BY(mu_);
};

CudaIpcDeviceSink::CudaIpcDeviceSink(int device, v1::CudaIpcPeer peer,
                                     CudaIpcLocalView local,
                                     CUstream_st* copy_stream)
    : device_(device),
      peer_(std::move(peer)),
      local_(std::move(local)),
      pool_(std::make_shared<Pool>(device)),
      copy_stream_(copy_stream) {}

absl::StatusOr<std::unique_ptr<CudaIpcDeviceSink>> CudaIpcDeviceSink::Create(
    int device) {
  auto peer = CudaIpcPeerOf(device);
  if (!peer.ok()) return peer.status();
  auto local = LocalCudaIpcView();
  if (!local.ok()) return local.status();
  TANDEM_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                     "creating the CUDA IPC sink's copy stream");
  return std::unique_ptr<CudaIpcDeviceSink>(new CudaIpcDeviceSink(
      device, *std::move(peer), *std::move(local), stream));
}

CudaIpcDeviceSink::~CudaIpcDeviceSink() {
  staging_.reset();  // back to the pool, freed with it
  cudaSetDevice(device_);
  cudaStreamSynchronize(copy_stream_);
  cudaStreamDestroy(copy_stream_);
}

std::shared_ptr<void> CudaIpcDeviceSink::TakeStaged() {
  capacity_ = 0;
  staged_bytes_ = 0;
  return std::move(staging_);
}

bool CudaIpcDeviceSink::hands_over() const { return TANDEM_ENABLE_CUDA != 0; }

StagedIpcCopy CudaIpcDeviceSink::TakeStagedCopy() {
  if (!hands_over() || staging_ == nullptr || staged_bytes_ == 0) return {};
  StagedIpcCopy copy;
  copy.bytes = staged_bytes_;
  copy.device = device_;
  copy.memory = TakeStaged();
#if TANDEM_ENABLE_CUDA
  const int device = device_;
  copy.crc32c = [device](const uint8_t* d,
                         uint64_t n) -> absl::StatusOr<uint32_t> {
    TANDEM_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    return kernels::cuda::Crc32cDevice(d, n);
  };
  copy.tree_sha256 = [device](const uint8_t* d,
                              uint64_t n) -> absl::StatusOr<std::string> {
    TANDEM_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    return kernels::cuda::Sha256TreeDevice(d, n);
  };
#endif
  return copy;
}

absl::Status CudaIpcDeviceSink::CopyOffer(const v1::CudaIpcOffer& offer,
                                          int device) {
  static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes);
  TANDEM_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
  if (staging_ == nullptr || capacity_ < offer.size()) {
    staging_.reset();  // back to the pool
    capacity_ = 0;
    staged_bytes_ = 0;
    const Pool::Free reused = pool_->Take(offer.size());
    void* fresh = reused.memory;
    uint64_t capacity = reused.capacity;
    if (fresh != nullptr) {
      // Its last owner dropped it, but kernels queued before may still read
      // it: the copy stream waits for them on the device (the event of the
      // drop); only a buffer without one waits here for the whole device.
      const cudaError_t e =
          reused.released != nullptr
              ? cudaStreamWaitEvent(copy_stream_, reused.released, 0)
              : cudaDeviceSynchronize();
      // Destroying a pending event is safe: released once it completes.
      if (reused.released != nullptr) cudaEventDestroy(reused.released);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        pool_->Put({fresh, capacity, nullptr});
        return CudaError(e, "waiting for the readers of a pooled buffer");
      }
    } else {
      // Every free buffer is too small: give them back before growing.
      pool_->Trim(0);
      TANDEM_CUDA_RETURN(cudaMalloc(&fresh, offer.size()),
                         "cudaMalloc of the device staging buffer");
      capacity = offer.size();
      ++allocations_;
    }
    staging_ = Pool::Own(pool_, fresh, capacity);
    capacity_ = capacity;
  }
  pool_->Trim(kMaxFreeBuffers);
  cudaIpcMemHandle_t handle;
  std::memcpy(handle.reserved, offer.handle().data(), sizeof(handle));
  void* mapped = nullptr;
  // Opened in this process's context on device_ (the offer's device may be
  // another GPU of the node: peer access is enabled lazily).
  const cudaError_t opened =
      cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cudaIpcOpenMemHandle of device ", offer.device_uuid(),
                     " (index ", device, "): ", cudaGetErrorName(opened), " (",
                     cudaGetErrorString(opened), ")"));
  }
  absl::Cleanup close = [mapped] { cudaIpcCloseMemHandle(mapped); };
  const auto* src = static_cast<const uint8_t*>(mapped) + offer.offset();
  char token[kCudaIpcTokenBytes];
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(token, src + offer.size(), sizeof(token),
                                     cudaMemcpyDeviceToHost, copy_stream_),
                     "reading the offered buffer's token");
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(copy_stream_),
                     "reading the offered buffer's token");
  if (offer.token() != std::string_view(token, sizeof(token))) {
    return absl::FailedPreconditionError(
        "cuda_ipc.token does not match the mapped allocation's: not the "
        "buffer offered");
  }
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(staging_.get(), src, offer.size(),
                                     cudaMemcpyDeviceToDevice, copy_stream_),
                     "copying the offered payload device-to-device");
  // Wait for the copy (this stream only, not the engine's kernels), so the
  // handle is closed (and the server's buffer released) only after it, and
  // whoever reads the copy next, on any stream, sees all of it.
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(copy_stream_), "finishing the copy");
  staged_bytes_ = offer.size();
  return absl::OkStatus();
}

absl::Status CudaIpcDeviceSink::ReadStaged(uint64_t offset,
                                           absl::Span<uint8_t> dst) {
  if (offset > staged_bytes_ || dst.size() > staged_bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("staged bytes [", offset, ", +",
                                              dst.size(), ") outside the ",
                                              staged_bytes_, " staged"));
  }
  TANDEM_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
  TANDEM_CUDA_RETURN(
      cudaMemcpy(dst.data(),
                 static_cast<const uint8_t*>(staging_.get()) + offset,
                 dst.size(), cudaMemcpyDeviceToHost),
      "copying staged weights to the host");
  return absl::OkStatus();
}

}  // namespace tandem::weights
