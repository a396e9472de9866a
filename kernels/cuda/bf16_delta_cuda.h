#pragma once

// CUDA versions of the delta kernels (compiled only with TANDEM_ENABLE_CUDA):
// the bf16 change mask with order-preserving compaction for the publisher,
// and the sparse patch for a receiver whose weights live on the GPU. The
// bit-level Rice coding stays on the CPU (kernels/bf16_delta.h): the
// compacted lists feed EncodeSparseDelta, and DecodeBf16DeltaOps produces
// the lists ApplyPatchCuda scatters.
//
// All pointers named d_* are device pointers. Functions enqueue work on
// `stream` (nullptr = the default stream) and synchronise it before
// returning, so outputs are ready on return. Temporary device memory is
// allocated per call unless the caller passes a DeviceScratch it keeps.
// Thread-safe as far as the CUDA runtime is (a DeviceScratch is not).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

// True when the CUDA runtime reports at least one usable device.
bool DeviceAvailable();

// Device memory that only grows: Get(n) returns the held allocation when
// it has room for n bytes on the current device, else frees it and
// allocates n bytes there (the contents are not kept). Freed with the
// object. Scratch for calls that synchronise before returning, so one
// call's use has ended before the next one's begins. Thread-compatible.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  absl::StatusOr<void*> Get(uint64_t bytes);
  // cudaMalloc calls so far (tests: a second call of the same size makes
  // none).
  int allocations() const { return allocations_; }

 private:
  void* data_ = nullptr;
  uint64_t capacity_ = 0;
  int device_ = -1;
  int allocations_ = 0;
};

// CompactChangedWords' temporaries: tile counts, tile offsets and the
// scan's temporary storage.
struct CompactScratch {
  DeviceScratch counts;
  DeviceScratch offsets;
  DeviceScratch temp;
  int allocations() const {
    return counts.allocations() + offsets.allocations() + temp.allocations();
  }
};

// Writes, in increasing index order, the indices of the words where
// d_prev and d_next differ, with the new and old words, into d_indices,
// d_new and d_old (each with room for `n` entries, the worst case; d_old may
// be null). Returns the number written. Its temporaries come from
// `scratch` when given (no allocation once it has grown to the largest n),
// else from allocations made and freed in the call.
absl::StatusOr<uint64_t> CompactChangedWords(const uint16_t* d_prev,
                                             const uint16_t* d_next, uint64_t n,
                                             uint64_t* d_indices,
                                             uint16_t* d_new, uint16_t* d_old,
                                             void* stream = nullptr,
                                             CompactScratch* scratch = nullptr);

// d_words[d_set_index[i]] = d_set_value[i] for i < num_set, then
// d_words[d_add_index[i]] += d_add_value[i] (mod 2^16) for i < num_add.
// Indices >= num_words are skipped (callers validate them on the host).
absl::Status ApplyPatch(uint16_t* d_words, uint64_t num_words,
                        const uint64_t* d_set_index,
                        const uint16_t* d_set_value, uint64_t num_set,
                        const uint64_t* d_add_index,
                        const uint16_t* d_add_value, uint64_t num_add,
                        void* stream = nullptr);

}  // namespace tandem::kernels::cuda
