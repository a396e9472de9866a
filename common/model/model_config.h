#pragma once

// The architecture hyper-parameters of a decoder-only language model, read
// from (and written back as) a Hugging Face `config.json`.
//
// Supported `architectures`: LlamaForCausalLM (Llama 2/3, incl. Llama-3
// "llama3" rope scaling), Qwen2ForCausalLM (q/k/v bias) and
// Qwen3ForCausalLM (per-head q/k RMSNorm, explicit head_dim). All three are
// the same pre-norm decoder: token embedding, N x (RMSNorm, grouped-query
// attention with RoPE, residual, RMSNorm, SwiGLU MLP, residual), final
// RMSNorm, LM head (tied to the embedding or separate).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem::model {

enum class Architecture { kLlama, kQwen2, kQwen3 };

// "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM".
absl::string_view ArchitectureName(Architecture arch);

// Rotary embedding frequency scaling. Only Llama-3's scheme is supported;
// "default" (or no `rope_scaling`) means unscaled RoPE.
struct RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// Element type of the weights: also the compute type of the model.
enum class WeightDType { kFloat32, kBFloat16 };

// "float32" / "bfloat16", as in `torch_dtype`.
absl::string_view WeightDTypeName(WeightDType dtype);

struct ModelConfig {
  Architecture architecture = Architecture::kQwen2;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  // Per-head width. config.json's `head_dim` when given (Qwen3, some Llama
  // variants), else hidden_size / num_attention_heads.
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  int64_t max_position_embeddings = 2048;
  // Bias on q_proj, k_proj and v_proj (always for Qwen2; `attention_bias`
  // for Llama and Qwen3, where o_proj then has one too).
  bool attention_bias = false;
  // Per-head RMSNorm of queries and keys before RoPE (Qwen3).
  bool qk_norm = false;
  bool tie_word_embeddings = false;
  // `torch_dtype` (or `dtype`) of the checkpoint. float16 checkpoints are read
  // as float32 (exact), since CPU LibTorch lacks fast half kernels.
  WeightDType dtype = WeightDType::kFloat32;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  // config.json as read, so that fields this struct does not model survive
  // a load/save round trip. Empty (null) for configs built in code.
  nlohmann::json raw;
};

// Checks the invariants the model relies on: positive sizes, heads that
// divide evenly (num_attention_heads % num_key_value_heads == 0), an even
// head_dim (RoPE), eps > 0, theta > 0, sane rope scaling. `source` prefixes
// messages, e.g. "dir/config.json: num_key_value_heads (3) must divide
// num_attention_heads (8)".
absl::Status ValidateModelConfig(const ModelConfig& config,
                                 absl::string_view source);

// Parses config.json text. `source` (usually the path) prefixes errors.
// Refuses unsupported `architectures` ("dir/config.json: architectures
// ['GPT2LMHeadModel'] is not supported; expected one of ..."),
// `model_type` that disagrees with it, rope scaling types other than
// "llama3"/"default", `hidden_act` other than "silu", Llama's `mlp_bias`,
// and sliding-window attention (use_sliding_window: true); missing required
// fields are named. RoPE comes from `rope_theta` / `rope_scaling` (written
// by transformers < 5 and by ModelConfigToJson) or from `rope_parameters`
// (transformers >= 5), with transformers' precedence; rope parameters per
// layer type are refused.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source);

// Reads `dir`/config.json.
absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& dir);

// The embedded default's tiny decoder (Qwen2 shape: 4 layers, width 128,
// tied embeddings, fp32, context 64) over a `vocab_size` vocabulary; shared
// by the rollout worker's built-in model and the SFT warm start. Callers
// set bos/eos ids.
ModelConfig BuiltinTinyModelConfig(int64_t vocab_size);

// config.json for `config`: `raw` with every modelled field overwritten
// (so unknown fields are kept), or a complete fresh config when `raw` is
// null. Loads in Hugging Face transformers.
nlohmann::json ModelConfigToJson(const ModelConfig& config);

// The shape of Qwen2.5-0.5B (hidden 896, 24 layers, 14 heads, 2 kv heads,
// intermediate 4864, vocab 151936, tied embeddings), for benchmarks.
ModelConfig Qwen2_5_0_5BConfig();

}  // namespace tandem::model
