#pragma once

// Decode attention over a paged KV cache, reading the keys and values in
// place (compiled only with TANDEM_ENABLE_CUDA). One query token per
// sequence: for each (sequence b, query head h) the kernel walks the
// sequence's block table, reads key and value rows of kv head
// h / (num_heads / num_kv_heads) (GQA) from the pool, and keeps an online
// softmax (running max and sum) with float32 accumulation, so no gathered
// copy of the keys and values is ever written. The CPU reference of the
// same algorithm is common/model/paged_attention.h.
//
// All pointers named d_* are device pointers, row-major and contiguous:
//   query   [batch, num_heads, head_dim]
//   pools   [num_slots, num_kv_heads, head_dim] (keys and values; slot
//           block * block_size + i holds token i of block `block`)
//   tables  [batch, table_width] int64: sequence b's token t lives in
//           block tables[b][t / block_size]
//   lengths [batch] int64: tokens sequence b attends to (1 to 2^31 - 1;
//           a row with length <= 0 gets zeros)
//   out     [batch, num_heads, head_dim], in the query's dtype.
// Block numbers and lengths are trusted (the caller built them from its
// caches); lengths[b] <= table_width * block_size.
//
// The launch is asynchronous on `stream` (nullptr = the default stream) and
// neither synchronises nor allocates, so it can be captured in a CUDA
// graph. Errors of the launch itself (bad configuration) come back as a
// Status; errors while it runs surface at the caller's next
// synchronisation.

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

enum class AttentionDtype { kFloat32, kBFloat16, kFloat16 };

struct PagedDecodeShape {
  int64_t batch = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  int64_t table_width = 0;
};

// Largest head_dim the kernel supports (each lane of a warp holds
// head_dim / 32 elements in registers).
inline constexpr int64_t kPagedDecodeMaxHeadDim = 256;

// out = softmax(scale * q k^T) v per (sequence, head), as above.
// InvalidArgument for sizes out of range (head_dim > 256, num_heads not a
// multiple of num_kv_heads, non-positive sizes).
absl::Status PagedDecodeAttention(const void* d_query, const void* d_key_pool,
                                  const void* d_value_pool,
                                  const int64_t* d_tables,
                                  const int64_t* d_lengths,
                                  const PagedDecodeShape& shape, float scale,
                                  AttentionDtype dtype, void* d_out,
                                  void* stream = nullptr);

}  // namespace tandem::kernels::cuda
