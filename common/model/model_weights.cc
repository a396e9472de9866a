#include "common/model/model_weights.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/CPUGeneratorImpl.h>

#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/torch_status.h"

namespace tandem::model {
namespace {

std::string LayerName(int64_t layer, absl::string_view suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// RMSNorm weights: input_layernorm, post_attention_layernorm, q_norm,
// k_norm and the final model.norm.
bool IsNormWeight(const std::string& name) {
  return absl::EndsWith(name, "norm.weight");
}

}  // namespace

at::ScalarType ToScalarType(WeightDType dtype) {
  return dtype == WeightDType::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c) {
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  std::vector<ExpectedTensor> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    out.push_back({LayerName(i, "input_layernorm.weight"), {c.hidden_size}});
    out.push_back(
        {LayerName(i, "self_attn.q_proj.weight"), {q_dim, c.hidden_size}});
    out.push_back(
        {LayerName(i, "self_attn.k_proj.weight"), {kv_dim, c.hidden_size}});
    out.push_back(
        {LayerName(i, "self_attn.v_proj.weight"), {kv_dim, c.hidden_size}});
    out.push_back(
        {LayerName(i, "self_attn.o_proj.weight"), {c.hidden_size, q_dim}});
    if (c.attention_bias) {
      out.push_back({LayerName(i, "self_attn.q_proj.bias"), {q_dim}});
      out.push_back({LayerName(i, "self_attn.k_proj.bias"), {kv_dim}});
      out.push_back({LayerName(i, "self_attn.v_proj.bias"), {kv_dim}});
      if (c.architecture != Architecture::kQwen2) {
        out.push_back({LayerName(i, "self_attn.o_proj.bias"), {c.hidden_size}});
      }
    }
    if (c.qk_norm) {
      out.push_back({LayerName(i, "self_attn.q_norm.weight"), {c.head_dim}});
      out.push_back({LayerName(i, "self_attn.k_norm.weight"), {c.head_dim}});
    }
    out.push_back(
        {LayerName(i, "post_attention_layernorm.weight"), {c.hidden_size}});
    out.push_back({LayerName(i, "mlp.gate_proj.weight"),
                   {c.intermediate_size, c.hidden_size}});
    out.push_back({LayerName(i, "mlp.up_proj.weight"),
                   {c.intermediate_size, c.hidden_size}});
    out.push_back({LayerName(i, "mlp.down_proj.weight"),
                   {c.hidden_size, c.intermediate_size}});
  }
  out.push_back({"model.norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) {
    out.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  }
  return out;
}

absl::StatusOr<std::shared_ptr<ModelWeights>> ModelWeights::Create(
    ModelConfig config, std::map<std::string, at::Tensor> tensors,
    absl::string_view source) {
  RETURN_IF_ERROR(ValidateModelConfig(config, source));
  auto error = [&](const std::string& name, const std::string& message) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": tensor '", name, "': ", message));
  };
  const at::ScalarType dtype = ToScalarType(config.dtype);
  const std::vector<ExpectedTensor> expected = ExpectedTensors(config);
  std::set<std::string> expected_names;
  std::optional<at::Device> device;
  for (const ExpectedTensor& e : expected) {
    expected_names.insert(e.name);
    auto it = tensors.find(e.name);
    if (it == tensors.end() || !it->second.defined()) {
      return error(e.name, absl::StrCat("missing (expected shape ",
                                        ShapeString(e.shape), ")"));
    }
    const at::Tensor& t = it->second;
    if (t.sizes() != at::IntArrayRef(e.shape)) {
      return error(e.name, absl::StrCat("expected shape ", ShapeString(e.shape),
                                        ", got ", ShapeString(t.sizes())));
    }
    if (t.scalar_type() != dtype) {
      return error(e.name,
                   absl::StrCat("expected dtype ", c10::toString(dtype),
                                ", got ", c10::toString(t.scalar_type())));
    }
    if (!device.has_value()) device = t.device();
    if (t.device() != *device) {
      return error(e.name,
                   absl::StrCat("on device ", t.device().str(),
                                " but other tensors are on ", device->str()));
    }
  }
  for (const auto& [name, tensor] : tensors) {
    if (expected_names.count(name) == 0) {
      return error(name, absl::StrCat("unexpected for ",
                                      ArchitectureName(config.architecture),
                                      " with this config"));
    }
  }
  std::shared_ptr<ModelWeights> w(new ModelWeights());
  w->dtype_ = dtype;
  w->device_ = *device;
  w->tensors_ = std::move(tensors);
  auto get = [&](const std::string& name) {
    auto it = w->tensors_.find(name);
    return it == w->tensors_.end() ? at::Tensor() : it->second;
  };
  w->embed_tokens_ = get("model.embed_tokens.weight");
  w->final_norm_ = get("model.norm.weight");
  w->lm_head_ =
      config.tie_word_embeddings ? w->embed_tokens_ : get("lm_head.weight");
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    LayerWeights l;
    l.input_layernorm = get(LayerName(i, "input_layernorm.weight"));
    l.q_proj = get(LayerName(i, "self_attn.q_proj.weight"));
    l.k_proj = get(LayerName(i, "self_attn.k_proj.weight"));
    l.v_proj = get(LayerName(i, "self_attn.v_proj.weight"));
    l.o_proj = get(LayerName(i, "self_attn.o_proj.weight"));
    l.q_bias = get(LayerName(i, "self_attn.q_proj.bias"));
    l.k_bias = get(LayerName(i, "self_attn.k_proj.bias"));
    l.v_bias = get(LayerName(i, "self_attn.v_proj.bias"));
    l.o_bias = get(LayerName(i, "self_attn.o_proj.bias"));
    l.q_norm = get(LayerName(i, "self_attn.q_norm.weight"));
    l.k_norm = get(LayerName(i, "self_attn.k_norm.weight"));
    l.post_attention_layernorm =
        get(LayerName(i, "post_attention_layernorm.weight"));
    l.gate_proj = get(LayerName(i, "mlp.gate_proj.weight"));
    l.up_proj = get(LayerName(i, "mlp.up_proj.weight"));
    l.down_proj = get(LayerName(i, "mlp.down_proj.weight"));
    w->layers_.push_back(std::move(l));
  }
  w->config_ = std::move(config);
  return w;
}

int64_t ModelWeights::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.numel();
  return n;
}

int64_t ModelWeights::num_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.numel() * t.element_size();
  return n;
}

absl::StatusOr<std::shared_ptr<ModelWeights>> ModelWeights::To(
    at::Device device, WeightDType dtype) const {
  std::map<std::string, at::Tensor> copies;
  try {
    for (const auto& [name, t] : tensors_) {
      copies[name] = t.detach().to(device, ToScalarType(dtype),
                                   /*non_blocking=*/false, /*copy=*/true);
    }
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus(
        absl::StrCat("copying weights to ", device.str()), e);
  }
  ModelConfig config = config_;
  config.dtype = dtype;
  return Create(std::move(config), std::move(copies), "ModelWeights::To");
}

absl::Status ModelWeights::CopyValuesFrom(const ModelWeights& other) {
  if (other.tensors_.size() != tensors_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyValuesFrom: ", other.tensors_.size(),
                     " tensors, expected ", tensors_.size()));
  }
  for (const auto& [name, dst] : tensors_) {
    auto it = other.tensors_.find(name);
    if (it == other.tensors_.end() || it->second.sizes() != dst.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CopyValuesFrom: tensor '", name, "' missing or of another shape"));
    }
  }
  try {
    c10::NoGradGuard no_grad;
    for (auto& [name, dst] : tensors_) {
      at::Tensor target = dst;
      target.copy_(other.tensors_.at(name));
    }
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus("CopyValuesFrom", e);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ModelWeights>> RandomInit(
    const ModelConfig& config, uint64_t seed,
    const RandomInitOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(config, "RandomInit"));
  std::map<std::string, at::Tensor> tensors;
  try {
    c10::NoGradGuard no_grad;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const at::ScalarType dtype = ToScalarType(config.dtype);
    for (const ExpectedTensor& e : ExpectedTensors(config)) {
      at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(at::kFloat));
      if (IsNormWeight(e.name)) {
        if (options.norm_noise > 0) {
          t.normal_(1.0, options.norm_noise, gen);
        } else {
          t.fill_(1.0);
        }
      } else {
        t.normal_(0.0, options.stddev, gen);
      }
      tensors[e.name] = t.to(options.device, dtype);
    }
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus("RandomInit", e);
  }
  return ModelWeights::Create(config, std::move(tensors), "RandomInit");
}

}  // namespace tandem::model
