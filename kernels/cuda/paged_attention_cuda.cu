#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/paged_attention_cuda.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxPerLane = kPagedDecodeMaxHeadDim / 32;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half(x);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// One block per (sequence, query head): blockIdx.x = b * num_heads + h, so
// the heads sharing a kv head run side by side and their repeated reads of
// its rows mostly hit L2. Warp w takes tokens w, w + kWarps, ...; lane l
// holds elements l, l + 32, ... of the query, the token's key and value,
// and its share of the output accumulator (coalesced row reads). Each warp
// keeps its own online softmax (m, s, acc); the warps' states are merged
// through shared memory at the end.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    PagedDecodeKernel(const T* __restrict__ query,
                      const T* __restrict__ key_pool,
                      const T* __restrict__ value_pool,
                      const int64_t* __restrict__ tables,
                      const int64_t* __restrict__ lengths, int num_heads,
                      int group, int head_dim, int block_size,
                      int64_t table_width, int64_t kv_heads, float scale,
                      T* __restrict__ out) {
  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kPagedDecodeMaxHeadDim];
  const int64_t b = blockIdx.x / num_heads;
  const int h = blockIdx.x % num_heads;
  const int64_t kv_head = h / group;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // 32-bit token arithmetic (lengths are far below 2^31; 64-bit division
  // costs dozens of instructions per token).
  const int length = static_cast<int>(lengths[b]);
  T* out_row = out + (b * num_heads + h) * head_dim;
  if (length <= 0) {
    for (int d = threadIdx.x; d < head_dim; d += kThreads) {
      out_row[d] = FromFloat<T>(0.0f);
    }
    return;
  }
  const T* q_row = query + (b * num_heads + h) * head_dim;
  float q[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int d = lane + 32 * j;
    q[j] = d < head_dim ? ToFloat(q_row[d]) * scale : 0.0f;
    acc[j] = 0.0f;
  }
  const int64_t row_stride = kv_heads * head_dim;
  const int64_t* table = tables + b * table_width;
  float m = -INFINITY, s = 0.0f;
  for (int t = warp; t < length; t += kWarps) {
    const int64_t slot = table[t / block_size] * block_size + t % block_size;
    const int64_t offset = slot * row_stride + kv_head * head_dim;
    const T* k_row = key_pool + offset;
    const T* v_row = value_pool + offset;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < head_dim) dot += q[j] * ToFloat(k_row[d]);
    }
    const float score = WarpSum(dot);
    const float next_m = fmaxf(m, score);
    const float correction = __expf(m - next_m);
    const float p = __expf(score - next_m);
    s = s * correction + p;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < head_dim) acc[j] = acc[j] * correction + p * ToFloat(v_row[d]);
    }
    m = next_m;
  }
  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = s;
  }
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int d = lane + 32 * j;
    if (d < head_dim) warp_acc[warp][d] = acc[j];
  }
  __syncthreads();
  // A warp that saw no token has m = -inf and s = 0: weight exp(-inf) = 0.
  float max_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) max_all = fmaxf(max_all, warp_max[w]);
  float weight[kWarps];
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = __expf(warp_max[w] - max_all);
    sum += warp_sum[w] * weight[w];
  }
  const float inv_sum = 1.0f / sum;
  for (int d = threadIdx.x; d < head_dim; d += kThreads) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += warp_acc[w][d] * weight[w];
    out_row[d] = FromFloat<T>(o * inv_sum);
  }
}

template <typename T>
void Launch(const void* query, const void* key_pool, const void* value_pool,
            const int64_t* tables, const int64_t* lengths,
            const PagedDecodeShape& shape, float scale, void* out,
            cudaStream_t stream) {
  const int64_t blocks = shape.batch * shape.num_heads;
  PagedDecodeKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const T*>(query), static_cast<const T*>(key_pool),
      static_cast<const T*>(value_pool), tables, lengths,
      static_cast<int>(shape.num_heads),
      static_cast<int>(shape.num_heads / shape.num_kv_heads),
      static_cast<int>(shape.head_dim), static_cast<int>(shape.block_size),
      shape.table_width, shape.num_kv_heads, scale, static_cast<T*>(out));
}

}  // namespace

absl::Status PagedDecodeAttention(const void* d_query, const void* d_key_pool,
                                  const void* d_value_pool,
                                  const int64_t* d_tables,
                                  const int64_t* d_lengths,
                                  const PagedDecodeShape& shape, float scale,
                                  AttentionDtype dtype, void* d_out,
                                  void* stream) {
  const PagedDecodeShape& s = shape;
  if (s.batch < 0 || s.num_heads <= 0 || s.num_kv_heads <= 0 ||
      s.num_heads % s.num_kv_heads != 0 || s.head_dim <= 0 ||
      s.head_dim > kPagedDecodeMaxHeadDim || s.block_size <= 0 ||
      s.block_size > (int64_t{1} << 30) || s.table_width <= 0 ||
      s.batch * s.num_heads > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "paged decode attention (CUDA): need batch >= 0, heads > 0 a "
        "multiple of kv_heads > 0, 0 < head_dim <= ",
        kPagedDecodeMaxHeadDim,
        ", block_size > 0, table_width > 0; got "
        "batch ",
        s.batch, ", heads ", s.num_heads, ", kv_heads ", s.num_kv_heads,
        ", head_dim ", s.head_dim, ", block_size ", s.block_size,
        ", table_width ", s.table_width));
  }
  if (s.batch == 0) return absl::OkStatus();
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case AttentionDtype::kFloat32:
      Launch<float>(d_query, d_key_pool, d_value_pool, d_tables, d_lengths, s,
                    scale, d_out, cuda_stream);
      break;
    case AttentionDtype::kBFloat16:
      Launch<__nv_bfloat16>(d_query, d_key_pool, d_value_pool, d_tables,
                            d_lengths, s, scale, d_out, cuda_stream);
      break;
    case AttentionDtype::kFloat16:
      Launch<__half>(d_query, d_key_pool, d_value_pool, d_tables, d_lengths, s,
                     scale, d_out, cuda_stream);
      break;
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(
        std::string("paged decode attention (CUDA): launch failed: ") +
        cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
