#include "common/weights/cuda_ipc_device.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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

absl::StatusOr<std::unique_ptr<CudaIpcDeviceSink>> CudaIpcDeviceSink::Create(
    int device) {
  auto peer = CudaIpcPeerOf(device);
  if (!peer.ok()) return peer.status();
  auto local = LocalCudaIpcView();
  if (!local.ok()) return local.status();
  return std::unique_ptr<CudaIpcDeviceSink>(
      new CudaIpcDeviceSink(device, *std::move(peer), *std::move(local)));
}

CudaIpcDeviceSink::~CudaIpcDeviceSink() = default;

std::shared_ptr<void> CudaIpcDeviceSink::TakeStaged() {
  capacity_ = 0;
  staged_bytes_ = 0;
  return std::move(staging_);
}

absl::Status CudaIpcDeviceSink::CopyOffer(const v1::CudaIpcOffer& offer,
                                          int device) {
  static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes);
  TANDEM_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
  if (staging_ == nullptr || capacity_ < offer.size()) {
    staging_.reset();
    capacity_ = 0;
    staged_bytes_ = 0;
    void* fresh = nullptr;
    TANDEM_CUDA_RETURN(cudaMalloc(&fresh, offer.size()),
                       "cudaMalloc of the device staging buffer");
    const int device = device_;
    staging_ = std::shared_ptr<void>(fresh, [device](void* p) {
      cudaSetDevice(device);
      cudaFree(p);
    });
    capacity_ = offer.size();
  }
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
  TANDEM_CUDA_RETURN(cudaMemcpy(token, src + offer.size(), sizeof(token),
                                cudaMemcpyDeviceToHost),
                     "reading the offered buffer's token");
  if (offer.token() != std::string_view(token, sizeof(token))) {
    return absl::FailedPreconditionError(
        "cuda_ipc.token does not match the mapped allocation's: not the "
        "buffer offered");
  }
  TANDEM_CUDA_RETURN(
      cudaMemcpy(staging_.get(), src, offer.size(), cudaMemcpyDeviceToDevice),
      "copying the offered payload device-to-device");
  // A device-to-device cudaMemcpy returns before the copy ends: wait, so
  // the handle is closed (and the server's buffer released) only after.
  TANDEM_CUDA_RETURN(cudaDeviceSynchronize(), "finishing the copy");
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
