// GPU test of the CUDA token log-probs: values and both gradients equal a
// double-precision full-logits reference on random inputs, with a
// vocabulary that is not a multiple of the kernels' tile. Passes trivially
// (with a warning) without a CUDA device, so the build checks it compiles.

#include "kernels/cuda/token_logprobs_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/bf16_delta_cuda.h"  // DeviceAvailable

namespace tandem::kernels {
namespace {

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d),
                     std::max<size_t>(host.size(), 1) * sizeof(T)) ==
          cudaSuccess);
  REQUIRE(cudaMemcpy(d, host.data(), host.size() * sizeof(T),
                     cudaMemcpyHostToDevice) == cudaSuccess);
  return d;
}

template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> host(n);
  REQUIRE(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  return host;
}

TEST_CASE("CUDA token log-probs and gradients equal the full-logits ones",
          "[cuda][logprobs]") {
  if (!cuda::DeviceAvailable()) {
    WARN("no CUDA device: skipping");
    return;
  }
  const int64_t n = 37, h = 48, v = 1001;
  const double temperature = 0.7;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::uniform_int_distribution<int64_t> token(0, v - 1);
  std::vector<float> hidden(n * h), lm_head(v * h), grad(n);
  std::vector<int64_t> targets(n);
  for (float& x : hidden) x = normal(rng);
  for (float& x : lm_head) x = normal(rng);
  for (float& x : grad) x = normal(rng);
  for (int64_t& t : targets) t = token(rng);

  // Reference in double: full logits, softmax, analytic gradients.
  std::vector<double> ref_lp(n), ref_gh(n * h, 0.0), ref_gw(v * h, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> logit(v);
    double m = -INFINITY;
    for (int64_t w = 0; w < v; ++w) {
      double dot = 0;
      for (int64_t i = 0; i < h; ++i)
        dot += hidden[t * h + i] * lm_head[w * h + i];
      logit[w] = dot / temperature;
      m = std::max(m, logit[w]);
    }
    double s = 0;
    for (double l : logit) s += std::exp(l - m);
    const double lse = m + std::log(s);
    ref_lp[t] = logit[targets[t]] - lse;
    const double g = grad[t] / temperature;
    for (int64_t w = 0; w < v; ++w) {
      const double c =
          g * ((w == targets[t] ? 1.0 : 0.0) - std::exp(logit[w] - lse));
      for (int64_t i = 0; i < h; ++i) {
        ref_gh[t * h + i] += c * lm_head[w * h + i];
        ref_gw[w * h + i] += c * hidden[t * h + i];
      }
    }
  }

  float* d_hidden = ToDevice(hidden);
  float* d_lm_head = ToDevice(lm_head);
  int64_t* d_targets = ToDevice(targets);
  float* d_grad = ToDevice(grad);
  float* d_lp = ToDevice(std::vector<float>(n));
  float* d_lse = ToDevice(std::vector<float>(n));
  float* d_gh = ToDevice(std::vector<float>(n * h));
  float* d_gw = ToDevice(std::vector<float>(v * h));
  REQUIRE(cuda::TokenLogProbsForward(d_hidden, d_lm_head, d_targets, n, h, v,
                                     temperature, d_lp, d_lse)
              .ok());
  REQUIRE(cuda::TokenLogProbsBackward(d_hidden, d_lm_head, d_targets, d_lse,
                                      d_grad, n, h, v, temperature, d_gh, d_gw)
              .ok());
  const auto lp = ToHost(d_lp, n);
  const auto gh = ToHost(d_gh, n * h);
  const auto gw = ToHost(d_gw, v * h);
  for (int64_t t = 0; t < n; ++t)
    CHECK(lp[t] == Approx(ref_lp[t]).margin(1e-4));
  double max_h = 0, max_w = 0;
  for (size_t i = 0; i < gh.size(); ++i) {
    max_h = std::max(max_h, std::abs(gh[i] - ref_gh[i]));
  }
  for (size_t i = 0; i < gw.size(); ++i) {
    max_w = std::max(max_w, std::abs(gw[i] - ref_gw[i]));
  }
  CHECK(max_h < 1e-4);
  CHECK(max_w < 1e-4);
  for (void* p : {static_cast<void*>(d_hidden), static_cast<void*>(d_lm_head),
                  static_cast<void*>(d_targets), static_cast<void*>(d_grad),
                  static_cast<void*>(d_lp), static_cast<void*>(d_lse),
                  static_cast<void*>(d_gh), static_cast<void*>(d_gw)}) {
    cudaFree(p);
  }
}

}  // namespace
}  // namespace tandem::kernels
