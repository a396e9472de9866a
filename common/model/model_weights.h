#pragma once

// The parameters of a decoder, as named tensors with Hugging Face names.
//
// A ModelWeights is one complete, validated set of parameters for one
// ModelConfig, on one device, in one dtype. Models (DecoderModel) point to a
// ModelWeights through a shared_ptr, so an inflight weight update loads the
// next version into a second, staging ModelWeights in the background and
// then swaps the pointer (see DecoderModel::SwapWeights).
//
// Names, for layer i (Llama / Qwen2 / Qwen3 share them):
//   model.embed_tokens.weight                         [vocab, hidden]
//   model.layers.i.input_layernorm.weight             [hidden]
//   model.layers.i.self_attn.q_proj.weight            [heads*head_dim, hidden]
//   model.layers.i.self_attn.k_proj.weight            [kv_heads*head_dim,
//   hidden] model.layers.i.self_attn.v_proj.weight [kv_heads*head_dim, hidden]
//   model.layers.i.self_attn.{q,k,v}_proj.bias        (attention_bias)
//   model.layers.i.self_attn.o_proj.weight            [hidden, heads*head_dim]
//   model.layers.i.self_attn.o_proj.bias              (attention_bias, not
//   Qwen2) model.layers.i.self_attn.{q,k}_norm.weight        [head_dim] (Qwen3)
//   model.layers.i.post_attention_layernorm.weight    [hidden]
//   model.layers.i.mlp.{gate,up}_proj.weight          [intermediate, hidden]
//   model.layers.i.mlp.down_proj.weight               [hidden, intermediate]
//   model.norm.weight                                 [hidden]
//   lm_head.weight                                    [vocab, hidden] (untied)

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/model_config.h"

namespace tandem::model {

// at::kFloat or at::kBFloat16.
at::ScalarType ToScalarType(WeightDType dtype);

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor a checkpoint of `config` must hold, in a fixed order
// (embedding, layers in order, final norm, lm_head).
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);

// Handles to one layer's tensors (they share storage with the named map).
// Optional tensors are undefined when the config does not have them.
struct LayerWeights {
  at::Tensor input_layernorm;
  at::Tensor q_proj, k_proj, v_proj, o_proj;
  at::Tensor q_bias, k_bias, v_bias, o_bias;
  at::Tensor q_norm, k_norm;
  at::Tensor post_attention_layernorm;
  at::Tensor gate_proj, up_proj, down_proj;
};

// Thread safety: immutable after Create() in the sense that the set of
// tensors never changes; the tensors' values may be changed in place (an
// optimizer step, CopyValuesFrom) by a caller who guarantees that no
// forward pass reads them at the same time. Const methods are safe to call
// concurrently.
class ModelWeights {
 public:
  // Validates and adopts `tensors`: exactly the names of
  // ExpectedTensors(config) (an extra or missing name is an error), each
  // with its expected shape, all of dtype ToScalarType(config.dtype) on one
  // device. Errors name `source` and the tensor, e.g.
  //   "dir: tensor 'model.norm.weight': expected shape [64], got [32]".
  static absl::StatusOr<std::shared_ptr<ModelWeights>> Create(
      ModelConfig config, std::map<std::string, at::Tensor> tensors,
      absl::string_view source);

  ModelWeights(const ModelWeights&) = delete;
  ModelWeights& operator=(const ModelWeights&) = delete;

  const ModelConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }

  // All parameters by Hugging Face name. With tied embeddings there is no
  // "lm_head.weight": lm_head() is embed_tokens().
  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }

  const at::Tensor& embed_tokens() const { return embed_tokens_; }
  const at::Tensor& final_norm() const { return final_norm_; }
  const at::Tensor& lm_head() const { return lm_head_; }
  const LayerWeights& layer(int64_t i) const { return layers_[i]; }

  // Sum of numel over tensors() (tied weights counted once).
  int64_t num_parameters() const;
  int64_t num_bytes() const;

  // A deep copy converted to `device` / `dtype` (the config's dtype follows).
  absl::StatusOr<std::shared_ptr<ModelWeights>> To(at::Device device,
                                                   WeightDType dtype) const;

  // Overwrites every tensor's values with `other`'s (same config shapes;
  // dtype and device may differ and are converted). For the in-place
  // update mode where two copies do not fit. Not safe during a forward.
  absl::Status CopyValuesFrom(const ModelWeights& other);

 private:
  ModelWeights() = default;

  ModelConfig config_;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  std::map<std::string, at::Tensor> tensors_;
  at::Tensor embed_tokens_, final_norm_, lm_head_;
  std::vector<LayerWeights> layers_;
};

struct RandomInitOptions {
  // Linear, embedding and bias entries ~ N(0, stddev^2) (transformers'
  // initializer_range is 0.02).
  double stddev = 0.02;
  // Norm weights are 1 + N(0, norm_noise^2); 0 gives exactly 1 as in
  // transformers. Tests use noise so that a wrong norm weight shows.
  double norm_noise = 0.0;
  at::Device device = at::kCPU;
};

// Random weights for `config` in config.dtype, drawn in float32 on the CPU
// from a generator seeded with `seed` in ExpectedTensors() order, then
// converted; so the same seed gives the same values on every device, and a
// bfloat16 init is the rounding of the float32 one.
absl::StatusOr<std::shared_ptr<ModelWeights>> RandomInit(
    const ModelConfig& config, uint64_t seed,
    const RandomInitOptions& options = {});

}  // namespace tandem::model
