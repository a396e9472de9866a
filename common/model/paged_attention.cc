#include "common/model/paged_attention.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#if TANDEM_ENABLE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda/paged_attention_cuda.h"
#endif

namespace tandem::model {
namespace {

void CheckArguments(const at::Tensor& query, const at::Tensor& key_pool,
                    const at::Tensor& value_pool, const at::Tensor& tables,
                    const at::Tensor& lengths, int64_t block_size) {
  TORCH_CHECK(query.dim() == 3 && key_pool.dim() == 3 &&
                  key_pool.sizes() == value_pool.sizes(),
              "paged decode attention: query must be [B, heads, dim] and the "
              "pools [slots, kv_heads, dim] of one shape, got query ",
              query.sizes(), ", keys ", key_pool.sizes(), ", values ",
              value_pool.sizes());
  const int64_t batch = query.size(0);
  const int64_t heads = query.size(1);
  const int64_t kv_heads = key_pool.size(1);
  TORCH_CHECK(query.size(2) == key_pool.size(2) && kv_heads > 0 &&
                  heads % kv_heads == 0,
              "paged decode attention: query ", query.sizes(),
              " does not fit pools of ", key_pool.sizes(),
              " (head_dim must match, heads a multiple of kv_heads)");
  TORCH_CHECK(query.scalar_type() == key_pool.scalar_type() &&
                  key_pool.scalar_type() == value_pool.scalar_type(),
              "paged decode attention: query ", query.scalar_type(), ", keys ",
              key_pool.scalar_type(), ", values ", value_pool.scalar_type(),
              " must share one dtype");
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == batch &&
                  tables.size(1) > 0 && tables.scalar_type() == at::kLong &&
                  lengths.dim() == 1 && lengths.size(0) == batch &&
                  lengths.scalar_type() == at::kLong,
              "paged decode attention: need int64 tables [", batch,
              ", width > 0] and lengths [", batch, "], got ", tables.sizes(),
              " ", tables.scalar_type(), " and ", lengths.sizes(), " ",
              lengths.scalar_type());
  TORCH_CHECK(block_size > 0, "paged decode attention: block_size ", block_size,
              " must be > 0");
  TORCH_CHECK(key_pool.is_contiguous() && value_pool.is_contiguous(),
              "paged decode attention: the pools must be contiguous");
}

// One (sequence, head) row of the reference: the kernel's algorithm (an
// online softmax over the tokens in order, float32 state) on one thread.
template <typename T>
void AttendRow(const T* q_row, const T* key_pool, const T* value_pool,
               const int64_t* table, int64_t length, int64_t block_size,
               int64_t row_stride, int64_t head_offset, int64_t dim,
               float scale, float* q, float* acc, T* out_row) {
  if (length <= 0) {
    std::fill(out_row, out_row + dim, static_cast<T>(0.0f));
    return;
  }
  for (int64_t d = 0; d < dim; ++d) {
    q[d] = static_cast<float>(q_row[d]) * scale;
    acc[d] = 0.0f;
  }
  float m = -std::numeric_limits<float>::infinity();
  float s = 0.0f;
  for (int64_t t = 0; t < length; ++t) {
    const int64_t slot = table[t / block_size] * block_size + t % block_size;
    const T* k_row = key_pool + slot * row_stride + head_offset;
    const T* v_row = value_pool + slot * row_stride + head_offset;
    float score = 0.0f;
    for (int64_t d = 0; d < dim; ++d)
      score += q[d] * static_cast<float>(k_row[d]);
    const float next_m = std::max(m, score);
    const float correction = std::exp(m - next_m);
    const float p = std::exp(score - next_m);
    s = s * correction + p;
    for (int64_t d = 0; d < dim; ++d) {
      acc[d] = acc[d] * correction + p * static_cast<float>(v_row[d]);
    }
    m = next_m;
  }
  const float inv_s = 1.0f / s;
  for (int64_t d = 0; d < dim; ++d) out_row[d] = static_cast<T>(acc[d] * inv_s);
}

}  // namespace

absl::StatusOr<PagedAttention> ParsePagedAttention(std::string_view name) {
  if (name == "auto") return PagedAttention::kAuto;
  if (name == "gather") return PagedAttention::kGather;
  if (name == "kernel") return PagedAttention::kKernel;
  return absl::InvalidArgumentError(
      absl::StrCat("paged attention must be auto, gather or kernel, got '",
                   std::string(name), "'"));
}

const char* PagedAttentionName(PagedAttention mode) {
  switch (mode) {
    case PagedAttention::kAuto:
      return "auto";
    case PagedAttention::kGather:
      return "gather";
    case PagedAttention::kKernel:
      return "kernel";
  }
  return "?";
}

bool UsesDecodeKernel(PagedAttention mode) {
  return mode != PagedAttention::kGather;
}

at::Tensor PagedDecodeAttention(const at::Tensor& query,
                                const at::Tensor& key_pool,
                                const at::Tensor& value_pool,
                                const at::Tensor& tables,
                                const at::Tensor& lengths, int64_t block_size,
                                double scale) {
  if (!query.is_cuda()) {
    return internal::PagedDecodeAttentionCpu(
        query, key_pool, value_pool, tables, lengths, block_size, scale);
  }
#if TANDEM_ENABLE_CUDA
  CheckArguments(query, key_pool, value_pool, tables, lengths, block_size);
  namespace kc = ::tandem::kernels::cuda;
  kc::AttentionDtype dtype;
  switch (query.scalar_type()) {
    case at::kFloat:
      dtype = kc::AttentionDtype::kFloat32;
      break;
    case at::kBFloat16:
      dtype = kc::AttentionDtype::kBFloat16;
      break;
    case at::kHalf:
      dtype = kc::AttentionDtype::kFloat16;
      break;
    default:
      TORCH_CHECK(false, "paged decode attention: dtype ", query.scalar_type(),
                  " is not float32, bfloat16 or float16");
  }
  const c10::cuda::CUDAGuard guard(query.device());
  const at::Tensor q = query.contiguous();
  const at::Tensor t = tables.contiguous();
  const at::Tensor l = lengths.contiguous();
  at::Tensor out = at::empty_like(q);
  kc::PagedDecodeShape shape;
  shape.batch = q.size(0);
  shape.num_heads = q.size(1);
  shape.num_kv_heads = key_pool.size(1);
  shape.head_dim = q.size(2);
  shape.block_size = block_size;
  shape.table_width = t.size(1);
  const absl::Status status = kc::PagedDecodeAttention(
      q.data_ptr(), key_pool.data_ptr(), value_pool.data_ptr(),
      t.data_ptr<int64_t>(), l.data_ptr<int64_t>(), shape,
      static_cast<float>(scale), dtype, out.data_ptr(),
      c10::cuda::getCurrentCUDAStream(query.device().index()).stream());
  TORCH_CHECK(status.ok(), std::string(status.message()));
  return out;
#else
  TORCH_CHECK(false,
              "paged decode attention: this build has no CUDA "
              "(TANDEM_ENABLE_CUDA off)");
#endif
}

namespace internal {

at::Tensor PagedDecodeAttentionCpu(const at::Tensor& query,
                                   const at::Tensor& key_pool,
                                   const at::Tensor& value_pool,
                                   const at::Tensor& tables,
                                   const at::Tensor& lengths,
                                   int64_t block_size, double scale) {
  CheckArguments(query, key_pool, value_pool, tables, lengths, block_size);
  TORCH_CHECK(!query.is_cuda() && !key_pool.is_cuda() && !tables.is_cuda(),
              "paged decode attention (CPU): tensors must be on the CPU");
  const at::Tensor q = query.contiguous();
  const at::Tensor t = tables.contiguous();
  const at::Tensor l = lengths.contiguous();
  at::Tensor out = at::empty_like(q);
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  const int64_t kv_heads = key_pool.size(1);
  const int64_t group = heads / kv_heads;
  const int64_t width = t.size(1);
  const int64_t* table_data = t.data_ptr<int64_t>();
  const int64_t* length_data = l.data_ptr<int64_t>();
  const int64_t slots = key_pool.size(0);
  for (int64_t b = 0; b < q.size(0); ++b) {
    TORCH_CHECK(length_data[b] <= width * block_size,
                "paged decode attention: sequence ", b, " has length ",
                length_data[b], " but its table covers ", width * block_size,
                " tokens");
    for (int64_t i = 0; i * block_size < length_data[b]; ++i) {
      const int64_t block = table_data[b * width + i];
      TORCH_CHECK(block >= 0 && (block + 1) * block_size <= slots,
                  "paged decode attention: sequence ", b, " block ", i, " is ",
                  block, ", outside a pool of ", slots / block_size, " blocks");
    }
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, q.scalar_type(), "PagedDecodeAttentionCpu",
      [&] {
        const scalar_t* q_data = q.data_ptr<scalar_t>();
        const scalar_t* k_data = key_pool.data_ptr<scalar_t>();
        const scalar_t* v_data = value_pool.data_ptr<scalar_t>();
        scalar_t* out_data = out.data_ptr<scalar_t>();
        at::parallel_for(
            0, q.size(0) * heads, 1, [&](int64_t begin, int64_t end) {
              std::vector<float> q_buf(dim), acc(dim);
              for (int64_t row = begin; row < end; ++row) {
                const int64_t b = row / heads;
                const int64_t h = row % heads;
                AttendRow(q_data + row * dim, k_data, v_data,
                          table_data + b * width, length_data[b], block_size,
                          kv_heads * dim, (h / group) * dim, dim,
                          static_cast<float>(scale), q_buf.data(), acc.data(),
                          out_data + row * dim);
              }
            });
      });
  return out;
}

}  // namespace internal
}  // namespace tandem::model
