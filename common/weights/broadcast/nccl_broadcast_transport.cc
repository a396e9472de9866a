#include "common/weights/broadcast/nccl_broadcast_transport.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/weights/broadcast/rendezvous_store.h"
#include "common/weights/broadcast/store_client.h"

namespace tandem::weights {
namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";
// Stored under kUniqueIdKey, followed by the reason, by NcclRefuseGroup.
constexpr absl::string_view kRefusal = "tandem-refused:";

#define TANDEM_CUDART_FUNCTIONS(X) \
  X(cudaFree)                      \
  X(cudaFreeHost)                  \
  X(cudaGetDevice)                 \
  X(cudaGetDeviceCount)            \
  X(cudaGetErrorName)              \
  X(cudaGetErrorString)            \
  X(cudaGetLastError)              \
  X(cudaMemcpyAsync)               \
  X(cudaPointerGetAttributes)      \
  X(cudaSetDevice)                 \
  X(cudaStreamCreateWithFlags)     \
  X(cudaStreamDestroy)             \
  X(cudaStreamQuery)
#define TANDEM_NCCL_FUNCTIONS(X) \
  X(ncclBroadcast)               \
  X(ncclCommAbort)               \
  X(ncclCommDestroy)             \
  X(ncclCommFinalize)            \
  X(ncclCommGetAsyncError)       \
  X(ncclCommInitRankConfig)      \
  X(ncclGetErrorString)          \
  X(ncclGetLastError)            \
  X(ncclGetUniqueId)

// The CUDA runtime and NCCL, loaded with dlopen on first use rather than
// linked: their static TLS (16 KiB) would otherwise be carved out of every
// thread's stack, and the metrics endpoint's civetweb workers (100 KiB
// stacks, fixed at civetweb's build) overflowed in the trainer and rollout
// worker. Loaded this way their TLS is allocated on demand, and a binary
// built with NCCL also starts where NCCL is not installed (the NCCL
// backend then fails with FailedPrecondition).
struct CudaNcclApi {
#define TANDEM_DECLARE_FUNCTION(f) decltype(&::f) f = nullptr;
  TANDEM_CUDART_FUNCTIONS(TANDEM_DECLARE_FUNCTION)
  TANDEM_NCCL_FUNCTIONS(TANDEM_DECLARE_FUNCTION)
#undef TANDEM_DECLARE_FUNCTION
  // Overloaded in C++ (cuda_runtime.h templates): the C entry points.
  cudaError_t (*cudaMalloc)(void**, size_t) = nullptr;
  cudaError_t (*cudaMallocHost)(void**, size_t) = nullptr;
};

// Opens `soname` (the loader's search path, LD_LIBRARY_PATH included), else
// `build_dir`/`soname` (where the build found it).
void* OpenLibrary(const std::string& soname, const char* build_dir,
                  std::string* error) {
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  std::string first = dlerror();
  const std::string path = absl::StrCat(build_dir, "/", soname);
  if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  *error =
      absl::StrCat("cannot load ", soname, " (", first, "; ", dlerror(), ")");
  return nullptr;
}

absl::StatusOr<const CudaNcclApi*> LoadApi() {
  auto api = std::make_unique<CudaNcclApi>();
  std::string error;
  void* cudart =
      OpenLibrary(absl::StrCat("libcudart.so.", CUDART_VERSION / 1000),
                  TANDEM_CUDART_DIR, &error);
  void* nccl = cudart == nullptr
                   ? nullptr
                   : OpenLibrary(absl::StrCat("libnccl.so.", NCCL_MAJOR),
                                 TANDEM_NCCL_DIR, &error);
  if (nccl == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL weight transport: ", error));
  }
#define TANDEM_RESOLVE(handle, f)                                              \
  api->f = reinterpret_cast<decltype(&::f)>(dlsym(handle, #f));                \
  if (api->f == nullptr) {                                                     \
    return absl::FailedPreconditionError(                                      \
        absl::StrCat("NCCL weight transport: no symbol " #f ": ", dlerror())); \
  }
#define TANDEM_RESOLVE_CUDART(f) TANDEM_RESOLVE(cudart, f)
#define TANDEM_RESOLVE_NCCL(f) TANDEM_RESOLVE(nccl, f)
  TANDEM_CUDART_FUNCTIONS(TANDEM_RESOLVE_CUDART)
  TANDEM_NCCL_FUNCTIONS(TANDEM_RESOLVE_NCCL)
  for (auto [name, slot] :
       {std::pair{"cudaMalloc", &api->cudaMalloc},
        std::pair{"cudaMallocHost", &api->cudaMallocHost}}) {
    *slot =
        reinterpret_cast<cudaError_t (*)(void**, size_t)>(dlsym(cudart, name));
    if (*slot == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "NCCL weight transport: no symbol ", name, ": ", dlerror()));
    }
  }
#undef TANDEM_RESOLVE_NCCL
#undef TANDEM_RESOLVE_CUDART
#undef TANDEM_RESOLVE
  // The libraries stay loaded for the life of the process.
  return api.release();
}

// Loads once; later calls return the same result.
const absl::StatusOr<const CudaNcclApi*>& LoadedApi() {
  static const absl::StatusOr<const CudaNcclApi*>* const api =
      new absl::StatusOr<const CudaNcclApi*>(LoadApi());
  return *api;
}

// REQUIRES: LoadedApi() is OK (checked by NcclVisibleDevices(), which
// every path calls first).
const CudaNcclApi& Api() { return **LoadedApi(); }

std::string CudaError(cudaError_t e) {
  return absl::StrCat(Api().cudaGetErrorName(e), ": ",
                      Api().cudaGetErrorString(e));
}

std::string PointerText(const void* p) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(p)));
}

// Polls with a short spin, then sleeps of growing length (at most 1 ms), so
// small broadcasts (the header) stay fast and long waits cost no CPU.
class Backoff {
 public:
  void Wait() {
    if (++polls_ < 64) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int polls_ = 0;
  std::chrono::microseconds sleep_{20};
};

// Runs `f` with `device` current on this thread, restoring the previous one.
template <typename F>
void OnDevice(int device, F f) {
  int previous = -1;
  const bool restore = Api().cudaGetDevice(&previous) == cudaSuccess;
  Api().cudaSetDevice(device);
  f();
  if (restore && previous != device) Api().cudaSetDevice(previous);
}

// A client of the trainer's TCPStore (throws like c10d::TCPStore, with a
// deadline: store_client.h), or of the rendezvous keyspace when the
// config names one (rendezvous_store.h).
c10::intrusive_ptr<c10d::Store> ConnectToStore(const NcclGroupConfig& config) {
  if (config.rendezvous != nullptr) {
    return c10::make_intrusive<KeyspaceStore>(
        config.rendezvous, config.key_prefix,
        std::chrono::milliseconds(absl::ToInt64Milliseconds(config.timeout)));
  }
  auto store =
      ConnectStoreClient(config.store_host, config.store_port, config.timeout);
  if (!store.ok()) throw std::runtime_error(store.status().ToString());
  return *std::move(store);
}

}  // namespace

absl::StatusOr<int> NcclVisibleDevices() {
  if (!LoadedApi().ok()) return LoadedApi().status();
  int count = 0;
  const cudaError_t e = Api().cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0) {
    // Clear the sticky-free error so later CUDA calls are not confused.
    Api().cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL weight transport: no CUDA device visible (cudaGetDeviceCount: ",
        e == cudaSuccess ? std::string("0 devices") : CudaError(e), ")"));
  }
  return count;
}

absl::Status NcclCheckStoredUniqueId(absl::Span<const uint8_t> stored) {
  const absl::string_view text(reinterpret_cast<const char*>(stored.data()),
                               stored.size());
  if (absl::StartsWith(text, kRefusal)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank 0 cannot run NCCL: ", text.substr(kRefusal.size())));
  }
  if (stored.size() != sizeof(ncclUniqueId)) {
    return absl::DataLossError(
        absl::StrCat("the store's ", kUniqueIdKey, " has ", stored.size(),
                     " bytes, want ", sizeof(ncclUniqueId)));
  }
  return absl::OkStatus();
}

absl::Status NcclRefuseGroup(const NcclGroupConfig& config,
                             absl::string_view reason) {
  try {
    c10::intrusive_ptr<c10d::Store> store = ConnectToStore(config);
    c10d::PrefixStore prefixed(config.key_prefix, store);
    const std::string value = absl::StrCat(kRefusal, reason);
    prefixed.set(kUniqueIdKey,
                 std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("nccl group ", config.key_prefix,
                     ": cannot store the refusal: ", e.what()));
  }
  return absl::OkStatus();
}

struct NcclBroadcastGroup::Impl {
  NcclGroupConfig config;
  int device = 0;
  std::string where;  // "nccl group <prefix> rank r/n (device d)"
  cudaStream_t stream = nullptr;
  uint8_t* device_buffer = nullptr;
  uint8_t* pinned = nullptr;  // nullptr: pageable copies
  std::atomic<bool> broken{false};
  std::atomic<bool> abort_requested{false};

  absl::Mutex mu;
  ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;
  bool comm_aborted ABSL_GUARDED_BY(mu) = false;
  // A Broadcast() is polling the communicator: it, not Abort(), aborts it.
  bool in_collective ABSL_GUARDED_BY(mu) = false;
  std::string broken_reason ABSL_GUARDED_BY(mu);

  ~Impl() {
    absl::MutexLock lock(&mu);
    if (comm != nullptr && !comm_aborted) {
      OnDevice(device, [&] { CloseCommLocked(); });
    }
    OnDevice(device, [&] {
      if (stream != nullptr) Api().cudaStreamDestroy(stream);
      if (device_buffer != nullptr) Api().cudaFree(device_buffer);
      if (pinned != nullptr) Api().cudaFreeHost(pinned);
    });
  }

  // A healthy communicator is finalized (bounded by the timeout), a broken
  // one aborted.
  void CloseCommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    bool clean = false;
    if (!broken.load()) {
      const ncclResult_t r = Api().ncclCommFinalize(comm);
      clean = r == ncclSuccess || r == ncclInProgress;
    }
    if (clean) {
      const absl::Time deadline = absl::Now() + config.timeout;
      Backoff backoff;
      ncclResult_t state = ncclInProgress;
      while (Api().ncclCommGetAsyncError(comm, &state) == ncclSuccess &&
             state == ncclInProgress && absl::Now() < deadline) {
        backoff.Wait();
      }
      clean = state == ncclSuccess;
    }
    if (clean) {
      Api().ncclCommDestroy(comm);
    } else {
      Api().ncclCommAbort(comm);
    }
    comm_aborted = true;
  }

  void AbortCommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (comm == nullptr || comm_aborted) return;
    OnDevice(device, [&] { Api().ncclCommAbort(comm); });
    comm_aborted = true;
  }

  void MarkBrokenLocked(const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (broken_reason.empty()) broken_reason = reason;
    broken = true;
  }

  // Records a failure of the calling (collective) thread: the group is
  // broken and the communicator aborted, so the peers' collectives fail
  // too instead of waiting for their deadline.
  absl::Status Fail(absl::Status status) {
    absl::MutexLock lock(&mu);
    MarkBrokenLocked(std::string(status.message()));
    AbortCommLocked();
    return status;
  }

  absl::Status NcclFailure(const std::string& what, ncclResult_t r) {
    std::string last;
    {
      absl::MutexLock lock(&mu);
      if (comm != nullptr && !comm_aborted) last = Api().ncclGetLastError(comm);
    }
    return Fail(absl::UnavailableError(absl::StrCat(
        where, ": ", what, " failed: ", Api().ncclGetErrorString(r),
        last.empty() ? "" : " (", last, last.empty() ? "" : ")")));
  }

  // Broadcast() (host memory) and BroadcastDevice() (`data` on `device`).
  absl::Status Run(uint8_t* data, uint64_t size, bool device_memory);

  // The watchdog. Waits until the communicator has no operation being
  // enqueued (non-blocking mode) and, if `stream_too`, the stream is idle;
  // fails on an NCCL error, Abort() or the deadline.
  absl::Status Wait(const std::string& what, absl::Time deadline,
                    bool stream_too) {
    Backoff backoff;
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclComm_t c;
      {
        absl::MutexLock lock(&mu);
        c = comm_aborted ? nullptr : comm;
      }
      if (c == nullptr) {
        return Fail(absl::CancelledError(
            absl::StrCat(where, ": ", what, " aborted (Abort() called)")));
      }
      if (ncclResult_t r = Api().ncclCommGetAsyncError(c, &state);
          r != ncclSuccess) {
        return NcclFailure(what + " (ncclCommGetAsyncError)", r);
      }
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclFailure(what, state);
      }
      if (state == ncclSuccess) {
        if (!stream_too) return absl::OkStatus();
        const cudaError_t q = Api().cudaStreamQuery(stream);
        if (q == cudaSuccess) return absl::OkStatus();
        if (q != cudaErrorNotReady) {
          return Fail(absl::UnavailableError(
              absl::StrCat(where, ": ", what, ": CUDA error ", CudaError(q))));
        }
      }
      if (abort_requested.load()) {
        return Fail(absl::CancelledError(
            absl::StrCat(where, ": ", what, " aborted (Abort() called)")));
      }
      // The communicator's init is the rendezvous: a stopping member ends
      // it (BroadcastGroupConfig::cancelled) and aborts the communicator.
      if (config.cancelled != nullptr && config.cancelled->load()) {
        return Fail(absl::CancelledError(
            absl::StrCat(where, ": ", what, " cancelled (stopping)")));
      }
      if (absl::Now() >= deadline) {
        return Fail(absl::DeadlineExceededError(
            absl::StrCat(where, ": ", what, " did not finish within ",
                         absl::FormatDuration(config.timeout),
                         " (a peer died or stopped taking part?)")));
      }
      backoff.Wait();
    }
  }
};

NcclBroadcastGroup::NcclBroadcastGroup(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

NcclBroadcastGroup::~NcclBroadcastGroup() = default;

absl::StatusOr<std::unique_ptr<NcclBroadcastGroup>> NcclBroadcastGroup::Create(
    const NcclGroupConfig& config) {
  if (config.world_size < 1 || config.rank < 0 ||
      config.rank >= config.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl group: rank ", config.rank, " outside world_size ",
                     config.world_size));
  }
  if (config.bucket_bytes == 0) {
    return absl::InvalidArgumentError("nccl group: bucket_bytes must be > 0");
  }
  absl::StatusOr<int> devices = NcclVisibleDevices();
  if (!devices.ok()) return devices.status();
  int device = config.device;
  if (device < 0) {
    if (cudaError_t e = Api().cudaGetDevice(&device); e != cudaSuccess) {
      return absl::FailedPreconditionError(
          absl::StrCat("nccl group: cudaGetDevice: ", CudaError(e)));
    }
  }
  if (device >= *devices) {
    return absl::InvalidArgumentError(absl::StrCat("nccl group: device ",
                                                   device, " not visible (",
                                                   *devices, " CUDA devices)"));
  }
  if (cudaError_t e = Api().cudaSetDevice(device); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nccl group: Api().cudaSetDevice(", device, "): ", CudaError(e)));
  }

  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->device = device;
  impl->where =
      absl::StrCat("nccl group ", config.key_prefix, " rank ", config.rank, "/",
                   config.world_size, " (device ", device, ", store ",
                   config.store_host, ":", config.store_port, ")");
  const absl::Time deadline = absl::Now() + config.timeout;

  // The unique id through the trainer's TCPStore.
  ncclUniqueId id;
  try {
    c10::intrusive_ptr<c10d::Store> store = ConnectToStore(config);
    c10d::PrefixStore prefixed(config.key_prefix, store);
    if (config.rank == 0) {
      if (ncclResult_t r = Api().ncclGetUniqueId(&id); r != ncclSuccess) {
        return absl::UnavailableError(absl::StrCat(
            impl->where,
            ": ncclGetUniqueId failed: ", Api().ncclGetErrorString(r)));
      }
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      prefixed.set(kUniqueIdKey, std::vector<uint8_t>(p, p + sizeof(id)));
    } else {
      const std::vector<uint8_t> bytes = prefixed.get(kUniqueIdKey);
      if (absl::Status s = NcclCheckStoredUniqueId(bytes); !s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat(impl->where, ": ", s.message()));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(impl->where, ": rendezvous failed: ", e.what()));
  }

  ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
  nccl_config.blocking = 0;
  {
    ncclComm_t comm = nullptr;
    const ncclResult_t r = Api().ncclCommInitRankConfig(
        &comm, config.world_size, id, config.rank, &nccl_config);
    absl::MutexLock lock(&impl->mu);
    impl->comm = comm;
    if (r != ncclSuccess && r != ncclInProgress) {
      impl->MarkBrokenLocked("ncclCommInitRankConfig failed");
      impl->AbortCommLocked();
      return absl::UnavailableError(absl::StrCat(
          impl->where,
          ": ncclCommInitRankConfig failed: ", Api().ncclGetErrorString(r)));
    }
  }
  if (absl::Status s = impl->Wait("communicator init", deadline, false);
      !s.ok()) {
    return s;
  }

  if (cudaError_t e =
          Api().cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return impl->Fail(absl::UnavailableError(
        absl::StrCat(impl->where, ": cudaStreamCreate: ", CudaError(e))));
  }
  if (cudaError_t e = Api().cudaMalloc(
          reinterpret_cast<void**>(&impl->device_buffer), config.bucket_bytes);
      e != cudaSuccess) {
    return impl->Fail(absl::ResourceExhaustedError(
        absl::StrCat(impl->where, ": cudaMalloc of ", config.bucket_bytes,
                     " staging bytes: ", CudaError(e))));
  }
  if (Api().cudaMallocHost(reinterpret_cast<void**>(&impl->pinned),
                           config.bucket_bytes) != cudaSuccess) {
    impl->pinned = nullptr;  // pageable copies
    Api().cudaGetLastError();
  }
  return std::unique_ptr<NcclBroadcastGroup>(
      new NcclBroadcastGroup(std::move(impl)));
}

int NcclBroadcastGroup::rank() const { return impl_->config.rank; }
int NcclBroadcastGroup::world_size() const { return impl_->config.world_size; }
int NcclBroadcastGroup::device() const { return impl_->device; }
bool NcclBroadcastGroup::broken() const { return impl_->broken.load(); }
bool NcclBroadcastGroup::pinned() const { return impl_->pinned != nullptr; }

void NcclBroadcastGroup::Abort() {
  impl_->abort_requested = true;
  absl::MutexLock lock(&impl_->mu);
  impl_->MarkBrokenLocked("Abort() called");
  if (!impl_->in_collective) impl_->AbortCommLocked();
}

absl::Status NcclBroadcastGroup::Broadcast(absl::Span<uint8_t> bytes) {
  return impl_->Run(bytes.data(), bytes.size(), /*device_memory=*/false);
}

absl::Status NcclBroadcastGroup::BroadcastDevice(void* device_ptr,
                                                 uint64_t bytes) {
  Impl& g = *impl_;
  if (bytes == 0) return g.Run(nullptr, 0, /*device_memory=*/true);
  // Refusals send nothing and leave the group as it is.
  if (device_ptr == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        g.where, ": BroadcastDevice got a null pointer for ", bytes,
        " bytes"));
  }
  cudaPointerAttributes attributes{};
  const cudaError_t e = Api().cudaPointerGetAttributes(&attributes, device_ptr);
  if (e != cudaSuccess) {
    Api().cudaGetLastError();
    return absl::InvalidArgumentError(
        absl::StrCat(g.where, ": cudaPointerGetAttributes(",
                     PointerText(device_ptr), "): ", CudaError(e)));
  }
  if (attributes.type != cudaMemoryTypeDevice &&
      attributes.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(absl::StrCat(
        g.where, ": BroadcastDevice got ", PointerText(device_ptr),
        ", which is not device memory (cudaMemoryType ",
        static_cast<int>(attributes.type),
        "); use Broadcast() for host bytes"));
  }
  if (attributes.device != g.device) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.where, ": BroadcastDevice got memory of device ",
                     attributes.device, ", this rank runs on device ",
                     g.device));
  }
  return g.Run(static_cast<uint8_t*>(device_ptr), bytes,
               /*device_memory=*/true);
}

absl::Status NcclBroadcastGroup::Impl::Run(uint8_t* data, uint64_t size,
                                           bool device_memory) {
  Impl& g = *this;
  {
    absl::MutexLock lock(&g.mu);
    if (g.abort_requested.load()) {
      return absl::CancelledError(
          absl::StrCat(g.where, " was aborted (Abort() called)"));
    }
    if (g.broken.load()) {
      return absl::FailedPreconditionError(
          absl::StrCat(g.where, " is broken (", g.broken_reason,
                       "); the next epoch must be formed"));
    }
    if (size == 0) return absl::OkStatus();
    g.in_collective = true;
  }
  absl::Status status = absl::OkStatus();
  if (cudaError_t e = Api().cudaSetDevice(g.device); e != cudaSuccess) {
    status = g.Fail(absl::UnavailableError(absl::StrCat(
        g.where, ": Api().cudaSetDevice(", g.device, "): ", CudaError(e))));
  }
  const bool root = g.config.rank == 0;
  // The same pieces for host and device memory: ranks may mix the two.
  for (uint64_t off = 0; status.ok() && off < size;
       off += g.config.bucket_bytes) {
    const uint64_t n = std::min<uint64_t>(g.config.bucket_bytes, size - off);
    uint8_t* host = data + off;
    // Device memory is broadcast where it lies; host bytes go through the
    // group's device buffer.
    uint8_t* on_device = device_memory ? data + off : g.device_buffer;
    const std::string what =
        absl::StrCat(device_memory ? "device " : "", "broadcast of bytes [",
                     off, ", ", off + n, ") of ", size);
    const absl::Time deadline = absl::Now() + g.config.timeout;
    auto cuda = [&](cudaError_t e, const char* call) {
      if (e == cudaSuccess) return true;
      status = g.Fail(absl::UnavailableError(
          absl::StrCat(g.where, ": ", what, ": ", call, ": ", CudaError(e))));
      return false;
    };
    if (root && !device_memory) {
      const uint8_t* src = host;
      if (g.pinned != nullptr) {
        std::memcpy(g.pinned, host, n);
        src = g.pinned;
      }
      if (!cuda(Api().cudaMemcpyAsync(g.device_buffer, src, n,
                                      cudaMemcpyHostToDevice, g.stream),
                "cudaMemcpyAsync H2D")) {
        break;
      }
    }
    ncclComm_t comm;
    {
      absl::MutexLock lock(&g.mu);
      comm = g.comm_aborted ? nullptr : g.comm;
    }
    if (comm == nullptr) {
      status = g.Fail(absl::CancelledError(
          absl::StrCat(g.where, ": ", what, " aborted (Abort() called)")));
      break;
    }
    const ncclResult_t r = Api().ncclBroadcast(on_device, on_device, n,
                                               ncclUint8, 0, comm, g.stream);
    if (r != ncclSuccess && r != ncclInProgress) {
      status = g.NcclFailure("ncclBroadcast (" + what + ")", r);
      break;
    }
    // The collective must finish before a pageable copy is issued (it would
    // block this thread on a hung kernel) and before the next piece reuses
    // the buffers.
    status = g.Wait(what, deadline, /*stream_too=*/true);
    if (!status.ok() || root || device_memory) continue;
    uint8_t* dst = g.pinned != nullptr ? g.pinned : host;
    if (!cuda(Api().cudaMemcpyAsync(dst, g.device_buffer, n,
                                    cudaMemcpyDeviceToHost, g.stream),
              "cudaMemcpyAsync D2H")) {
      break;
    }
    status = g.Wait(what + " (copy back)", deadline, /*stream_too=*/true);
    if (status.ok() && g.pinned != nullptr) std::memcpy(host, g.pinned, n);
  }
  absl::MutexLock lock(&g.mu);
  g.in_collective = false;
  // An Abort() that arrived after the last poll: finish its job.
  if (g.abort_requested.load()) g.AbortCommLocked();
  return status;
}

}  // namespace tandem::weights
