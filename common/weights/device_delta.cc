#include "common/weights/device_delta.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/bf16_delta.h"
#include "kernels/cuda/bf16_delta_cuda.h"

namespace tandem::weights {
namespace {

absl::Status CudaFailure(cudaError_t e, const std::string& what) {
  cudaGetLastError();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), ": ",
                                          cudaGetErrorString(e)));
}

// Device allocations on one stream, freed together (stream-ordered: no
// device-wide synchronisation with other streams' kernels).
class DeviceArrays {
 public:
  explicit DeviceArrays(cudaStream_t stream) : stream_(stream) {}
  ~DeviceArrays() {
    for (void* p : owned_) cudaFreeAsync(p, stream_);
  }
  template <typename T>
  absl::StatusOr<T*> Alloc(uint64_t count) {
    void* p = nullptr;
    if (cudaError_t e = cudaMallocAsync(
            &p, std::max<uint64_t>(count, 1) * sizeof(T), stream_);
        e != cudaSuccess) {
      return CudaFailure(
          e, absl::StrCat("cudaMallocAsync of ", count * sizeof(T), " bytes"));
    }
    owned_.push_back(p);
    return static_cast<T*>(p);
  }
  // A device copy of `host`.
  template <typename T>
  absl::StatusOr<T*> Upload(const std::vector<T>& host) {
    absl::StatusOr<T*> d = Alloc<T>(host.size());
    if (!d.ok() || host.empty()) return d;
    if (cudaError_t e =
            cudaMemcpyAsync(*d, host.data(), host.size() * sizeof(T),
                            cudaMemcpyHostToDevice, stream_);
        e != cudaSuccess) {
      return CudaFailure(e, "cudaMemcpyAsync H2D");
    }
    return d;
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> owned_;
};

}  // namespace

// The compactor's device scratch, grown to the largest slice and kept: a
// version costs no cudaMalloc after the first of its size.
struct CudaChangeCompactor::Scratch {
  kernels::cuda::DeviceScratch indices;
  kernels::cuda::DeviceScratch new_words;
  kernels::cuda::DeviceScratch old_words;
  kernels::cuda::CompactScratch compact;
};

CudaChangeCompactor::CudaChangeCompactor(uint64_t slice_words)
    : slice_words_(slice_words == 0 ? 1 : slice_words),
      scratch_(std::make_unique<Scratch>()) {}

CudaChangeCompactor::~CudaChangeCompactor() = default;

int CudaChangeCompactor::DeviceAllocationsForTest() const {
  return scratch_->indices.allocations() + scratch_->new_words.allocations() +
         scratch_->old_words.allocations() + scratch_->compact.allocations();
}

absl::StatusOr<CompactedChange> CudaChangeCompactor::Compact(
    const DeviceFlat& prev, const DeviceFlat& next, uint64_t max_listed) {
  if (prev.bytes != next.bytes || prev.bytes % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device change detection between ", prev.bytes, " and ",
                     next.bytes, " bytes (want equal, even sizes)"));
  }
  const uint64_t words = next.bytes / 2;
  const uint64_t slice = std::min(slice_words_, std::max<uint64_t>(words, 1));
  absl::StatusOr<void*> indices = scratch_->indices.Get(slice * 8);
  if (!indices.ok()) return indices.status();
  absl::StatusOr<void*> new_words = scratch_->new_words.Get(slice * 2);
  if (!new_words.ok()) return new_words.status();
  absl::StatusOr<void*> old_words = scratch_->old_words.Get(slice * 2);
  if (!old_words.ok()) return old_words.status();
  auto* d_indices = static_cast<uint64_t*>(*indices);
  auto* d_new = static_cast<uint16_t*>(*new_words);
  auto* d_old = static_cast<uint16_t*>(*old_words);
  const auto* p = reinterpret_cast<const uint16_t*>(prev.data);
  const auto* n = reinterpret_cast<const uint16_t*>(next.data);
  CompactedChange out;
  bool listing = true;
  for (uint64_t first = 0; first < words; first += slice) {
    const uint64_t count = std::min(slice, words - first);
    absl::StatusOr<uint64_t> changed = kernels::cuda::CompactChangedWords(
        p + first, n + first, count, d_indices, d_new, d_old,
        /*stream=*/nullptr, &scratch_->compact);
    if (!changed.ok()) return changed.status();
    out.changed_words += *changed;
    if (listing && out.changed_words > max_listed) {
      listing = false;  // too dense to encode: only count the rest
      out.indices = {};
      out.new_words = {};
      out.old_words = {};
    }
    if (!listing || *changed == 0) continue;
    const size_t at = out.indices.size();
    out.indices.resize(at + *changed);
    out.new_words.resize(at + *changed);
    out.old_words.resize(at + *changed);
    for (auto [dst, src, size] :
         {std::tuple<void*, const void*, size_t>{out.indices.data() + at,
                                                 d_indices, *changed * 8},
          {out.new_words.data() + at, d_new, *changed * 2},
          {out.old_words.data() + at, d_old, *changed * 2}}) {
      if (cudaError_t e = cudaMemcpy(dst, src, size, cudaMemcpyDeviceToHost);
          e != cudaSuccess) {
        return CudaFailure(e, "cudaMemcpy of the compacted change");
      }
    }
    for (size_t i = at; i < out.indices.size(); ++i) out.indices[i] += first;
  }
  return out;
}

absl::Status ApplyDeltaOnDevice(absl::Span<const uint8_t> delta,
                                uint8_t* d_flat, uint64_t bytes,
                                void* stream_ptr) {
  if (bytes % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta target of ", bytes, " bytes: not bf16 words"));
  }
  kernels::DeltaOps ops;
  if (absl::Status s = kernels::DecodeBf16DeltaOps(delta, bytes / 2, &ops);
      !s.ok()) {
    return s;
  }
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  DeviceArrays arrays(stream);
  absl::StatusOr<uint64_t*> si = arrays.Upload(ops.set_index);
  if (!si.ok()) return si.status();
  absl::StatusOr<uint16_t*> sv = arrays.Upload(ops.set_value);
  if (!sv.ok()) return sv.status();
  absl::StatusOr<uint64_t*> ai = arrays.Upload(ops.add_index);
  if (!ai.ok()) return ai.status();
  absl::StatusOr<uint16_t*> av = arrays.Upload(ops.add_value);
  if (!av.ok()) return av.status();
  return kernels::cuda::ApplyPatch(reinterpret_cast<uint16_t*>(d_flat),
                                   bytes / 2, *si, *sv, ops.set_index.size(),
                                   *ai, *av, ops.add_index.size(), stream);
}

}  // namespace tandem::weights
