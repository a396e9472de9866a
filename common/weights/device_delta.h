#pragma once

// Sparse bf16 delta sync where the weights live on a GPU (issue 22 item 4),
// with the CUDA kernels of kernels/cuda/bf16_delta_cuda.h:
//   - CudaChangeCompactor: the trainer's DeltaPublisher finds and compacts
//     the changed 16-bit words between two device versions on the device
//     and copies only the compacted lists to the host, where the host coder
//     encodes them (delta_publisher.h). Same delta bytes as the host path.
//   - ApplyDeltaOnDevice: a receiver whose staging buffer is on the device
//     decodes a delta on the host (which validates it) and patches the
//     device buffer with the decoded operations.
// Built only with TANDEM_ENABLE_CUDA (library tandem_weights_cuda).

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/weights/delta_publisher.h"

namespace tandem::weights {

// Compacts on the calling thread's current CUDA device (where both buffers
// must lie), on the default stream, in slices of at most
// `slice_words` words, so its device scratch (12 bytes per word of a
// slice, kept between calls) stays bounded whatever the model size; it
// stops listing (and only counts) once more than max_listed words
// changed. Thread-compatible.
class CudaChangeCompactor : public ChangeCompactor {
 public:
  explicit CudaChangeCompactor(uint64_t slice_words = uint64_t{8} << 20);
  ~CudaChangeCompactor() override;

  absl::StatusOr<CompactedChange> Compact(const DeviceFlat& prev,
                                          const DeviceFlat& next,
                                          uint64_t max_listed) override;

  // cudaMalloc calls of its scratch so far: the device scratch (the slice's
  // lists and the compaction's temporaries) is kept and grown, never
  // freed between versions, so a version of a size already seen
  // allocates nothing.
  int DeviceAllocationsForTest() const;

 private:
  struct Scratch;
  uint64_t slice_words_;
  std::unique_ptr<Scratch> scratch_;
};

// Applies an encoded delta (kernels/bf16_delta.h) to `bytes` bytes of
// device memory at d_flat, which holds the delta's base version. The delta
// is decoded and validated on the host first (DecodeBf16DeltaOps): a
// malformed one returns its DataLoss / InvalidArgument with d_flat
// untouched. CUDA failures are Internal. Synchronous on `stream`.
absl::Status ApplyDeltaOnDevice(absl::Span<const uint8_t> delta,
                                uint8_t* d_flat, uint64_t bytes,
                                void* stream = nullptr);

}  // namespace tandem::weights
