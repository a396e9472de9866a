#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/token_logprobs_cuda.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

absl::Status CudaError(cudaError_t err, const char* what) {
  return absl::InternalError(std::string(what) + ": " +
                             cudaGetErrorString(err));
}

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return __shfl_sync(0xffffffffu, v, 0);
}

// Dot product of two H-vectors by one warp (every lane gets the result).
__device__ float WarpDot(const float* a, const float* b, int64_t h) {
  const int lane = threadIdx.x % 32;
  float sum = 0.0f;
  for (int64_t i = lane; i < h; i += 32) sum += a[i] * b[i];
  return WarpSum(sum);
}

// One block per token; each warp walks a strided share of the vocabulary
// with an online (max, sum) pair, then the warps' pairs are merged.
// Shared memory: the hidden row [H].
__global__ void ForwardKernel(const float* hidden, const float* lm_head,
                              const int64_t* targets, int64_t h, int64_t v,
                              float inv_temperature, float* logprobs,
                              float* lse) {
  extern __shared__ float row[];
  __shared__ float warp_max[kWarps], warp_sum[kWarps], target_logit;
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    row[i] = hidden[t * h + i];
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t target = targets[t];
  float m = -INFINITY, s = 0.0f;
  for (int64_t w = warp; w < v; w += kWarps) {
    const float logit = WarpDot(row, lm_head + w * h, h) * inv_temperature;
    if (w == target && lane == 0) target_logit = logit;
    if (logit > m) {
      s = s * expf(m - logit) + 1.0f;
      m = logit;
    } else {
      s += expf(logit - m);
    }
  }
  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mm = -INFINITY;
    for (int i = 0; i < kWarps; ++i) mm = fmaxf(mm, warp_max[i]);
    float ss = 0.0f;
    for (int i = 0; i < kWarps; ++i) {
      if (warp_sum[i] > 0.0f) ss += warp_sum[i] * expf(warp_max[i] - mm);
    }
    const float l = mm + logf(ss);
    lse[t] = l;
    logprobs[t] = target_logit - l;
  }
}

// One block per token: acc = p @ lm_head over tiles of kWarps vocabulary
// rows (one warp per row computes p_v), then the token's hidden gradient.
// Shared memory: the hidden row [H] and the accumulator [H].
__global__ void GradHiddenKernel(const float* hidden, const float* lm_head,
                                 const int64_t* targets, const float* lse,
                                 const float* grad_logprobs, int64_t h,
                                 int64_t v, float inv_temperature,
                                 float* grad_hidden) {
  extern __shared__ float shared[];
  float* row = shared;
  float* acc = shared + h;
  __shared__ float p[kWarps];
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    row[i] = hidden[t * h + i];
    acc[i] = 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const float l = lse[t];
  for (int64_t base = 0; base < v; base += kWarps) {
    const int64_t w = base + warp;
    const float logit =
        w < v ? WarpDot(row, lm_head + w * h, h) * inv_temperature : 0.0f;
    if (lane == 0) p[warp] = w < v ? expf(logit - l) : 0.0f;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      float a = acc[i];
      for (int j = 0; j < kWarps && base + j < v; ++j) {
        a += p[j] * lm_head[(base + j) * h + i];
      }
      acc[i] = a;
    }
    __syncthreads();
  }
  const float g = grad_logprobs[t] * inv_temperature;
  const float* target_row = lm_head + targets[t] * h;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    grad_hidden[t * h + i] = g * (target_row[i] - acc[i]);
  }
}

// One block per vocabulary row: sum over tiles of kWarps tokens (one warp
// per token computes its coefficient). Shared memory: the lm_head row [H]
// and the accumulator [H].
__global__ void GradLmHeadKernel(const float* hidden, const float* lm_head,
                                 const int64_t* targets, const float* lse,
                                 const float* grad_logprobs, int64_t n,
                                 int64_t h, float inv_temperature,
                                 float* grad_lm_head) {
  extern __shared__ float shared[];
  float* row = shared;
  float* acc = shared + h;
  __shared__ float c[kWarps];
  const int64_t w = blockIdx.x;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    row[i] = lm_head[w * h + i];
    acc[i] = 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t base = 0; base < n; base += kWarps) {
    const int64_t t = base + warp;
    if (t < n) {
      const float logit = WarpDot(row, hidden + t * h, h) * inv_temperature;
      if (lane == 0) {
        const float indicator = targets[t] == w ? 1.0f : 0.0f;
        c[warp] = grad_logprobs[t] * inv_temperature *
                  (indicator - expf(logit - lse[t]));
      }
    } else if (lane == 0) {
      c[warp] = 0.0f;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      float a = acc[i];
      for (int j = 0; j < kWarps && base + j < n; ++j) {
        a += c[j] * hidden[(base + j) * h + i];
      }
      acc[i] = a;
    }
    __syncthreads();
  }
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    grad_lm_head[w * h + i] = acc[i];
  }
}

absl::Status CheckArguments(int64_t n, int64_t h, int64_t v,
                            float temperature) {
  if (n < 0 || h < 0 || v < 0 || !(temperature > 0.0f)) {
    return absl::InvalidArgumentError(
        "token log-probs (CUDA): sizes must be >= 0 and temperature > 0");
  }
  if (n > 0 && v == 0) {
    return absl::InvalidArgumentError(
        "token log-probs (CUDA): empty vocabulary");
  }
  return absl::OkStatus();
}

absl::Status Finish(cudaStream_t stream, const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, what);
}

}  // namespace

absl::Status TokenLogProbsForward(const float* d_hidden,
                                  const float* d_lm_head,
                                  const int64_t* d_targets, int64_t num_tokens,
                                  int64_t hidden_size, int64_t vocab_size,
                                  float temperature, float* d_logprobs,
                                  float* d_lse, void* stream) {
  absl::Status valid =
      CheckArguments(num_tokens, hidden_size, vocab_size, temperature);
  if (!valid.ok() || num_tokens == 0) return valid;
  auto s = static_cast<cudaStream_t>(stream);
  ForwardKernel<<<static_cast<unsigned>(num_tokens), kThreads,
                  hidden_size * sizeof(float), s>>>(
      d_hidden, d_lm_head, d_targets, hidden_size, vocab_size,
      1.0f / temperature, d_logprobs, d_lse);
  return Finish(s, "token log-probs forward");
}

absl::Status TokenLogProbsBackward(
    const float* d_hidden, const float* d_lm_head, const int64_t* d_targets,
    const float* d_lse, const float* d_grad_logprobs, int64_t num_tokens,
    int64_t hidden_size, int64_t vocab_size, float temperature,
    float* d_grad_hidden, float* d_grad_lm_head, void* stream) {
  absl::Status valid =
      CheckArguments(num_tokens, hidden_size, vocab_size, temperature);
  if (!valid.ok()) return valid;
  auto s = static_cast<cudaStream_t>(stream);
  const size_t shared = 2 * hidden_size * sizeof(float);
  if (num_tokens > 0) {
    GradHiddenKernel<<<static_cast<unsigned>(num_tokens), kThreads, shared,
                       s>>>(d_hidden, d_lm_head, d_targets, d_lse,
                            d_grad_logprobs, hidden_size, vocab_size,
                            1.0f / temperature, d_grad_hidden);
  }
  if (vocab_size > 0) {
    GradLmHeadKernel<<<static_cast<unsigned>(vocab_size), kThreads, shared,
                       s>>>(d_hidden, d_lm_head, d_targets, d_lse,
                            d_grad_logprobs, num_tokens, hidden_size,
                            1.0f / temperature, d_grad_lm_head);
  }
  return Finish(s, "token log-probs backward");
}

}  // namespace tandem::kernels::cuda
