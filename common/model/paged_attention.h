#pragma once

// Decode attention that reads a paged KV cache's blocks in place (issue 22
// item 2): one query token per sequence attends to the sequence's keys and
// values where they lie in the KvBlockPool (paged_kv_cache.h), through its
// block table, with an online softmax (running max and sum) in float32.
// Unlike PagedBatch's gather path (index_select of every sequence's keys
// and values into a padded copy, then one scaled_dot_product_attention),
// nothing the size of the KV cache is written, and each key and value row
// is read once per query head that uses it (GQA: the heads sharing a kv
// head read the same rows).
//
// On a CUDA tensor it runs kernels/cuda/paged_attention_cuda.h (one launch
// on the current stream, no host synchronisation: capturable in a CUDA
// graph); on the CPU the same algorithm in C++, the reference the tests
// compare with the gather path.
//
// This header includes no LibTorch header, so the engine's options can
// name PagedAttention without pulling LibTorch in.

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace at {
class Tensor;
}  // namespace at

namespace tandem::model {

// Which attention a PagedBatch runs on a decode-only step (one new token
// per sequence); prefill and mixed steps always gather:
//  kGather = index_select + scaled_dot_product_attention (the only path
//            that has run on a GPU so far);
//  kKernel = PagedDecodeAttention on every device (on the CPU the C++
//            reference);
//  kAuto   = the faster of the two per device: kKernel on CUDA devices
//            (it reads the KV cache once, the gather three times) and on
//            the CPU too, where engine_bench measured the reference faster
//            than the gather at batch 1, 8 and 32 (docs/benchmarks.md).
enum class PagedAttention { kAuto, kGather, kKernel };

// "auto" | "gather" | "kernel"; InvalidArgument naming the value otherwise.
absl::StatusOr<PagedAttention> ParsePagedAttention(std::string_view name);
const char* PagedAttentionName(PagedAttention mode);

// Whether a decode-only step under `mode` runs the kernel.
bool UsesDecodeKernel(PagedAttention mode);

// Attention outputs [B, heads, head_dim] (query's dtype) of
//   query      [B, heads, head_dim]
//   key_pool,
//   value_pool [num_blocks * block_size, kv_heads, head_dim], contiguous
//   tables     [B, width] int64: block of token t of sequence b is
//              tables[b][t / block_size]
//   lengths    [B] int64: sequence b attends to its tokens [0, lengths[b])
// all on one device, query and pools of one dtype (float32, bfloat16 or
// float16). heads must be a multiple of kv_heads (query head h reads kv
// head h / (heads / kv_heads)); on CUDA head_dim <= 256. Block numbers and
// lengths are trusted (the caller made them from its caches; REQUIRES:
// 1 <= lengths[b] <= width * block_size). Throws c10::Error on bad shapes
// or dtypes, or when the CUDA launch fails.
at::Tensor PagedDecodeAttention(const at::Tensor& query,
                                const at::Tensor& key_pool,
                                const at::Tensor& value_pool,
                                const at::Tensor& tables,
                                const at::Tensor& lengths, int64_t block_size,
                                double scale);

namespace internal {
// The CPU path of PagedDecodeAttention (CPU tensors; same contract).
at::Tensor PagedDecodeAttentionCpu(const at::Tensor& query,
                                   const at::Tensor& key_pool,
                                   const at::Tensor& value_pool,
                                   const at::Tensor& tables,
                                   const at::Tensor& lengths,
                                   int64_t block_size, double scale);
}  // namespace internal

}  // namespace tandem::model
