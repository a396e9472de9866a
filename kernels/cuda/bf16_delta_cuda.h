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
// allocated per call. Thread-safe as far as the CUDA runtime is.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

// True when the CUDA runtime reports at least one usable device.
bool DeviceAvailable();

// Writes, in increasing index order, the indices of the words where
// d_prev and d_next differ, with the new and old words, into d_indices,
// d_new and d_old (each with room for `n` entries, the worst case; d_old may
// be null). Returns the number written.
absl::StatusOr<uint64_t> CompactChangedWords(const uint16_t* d_prev,
                                             const uint16_t* d_next, uint64_t n,
                                             uint64_t* d_indices,
                                             uint16_t* d_new, uint16_t* d_old,
                                             void* stream = nullptr);

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
