#include "common/model/model_config.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace tandem::model {
namespace {

using nlohmann::json;

constexpr absl::string_view kSupportedArchitectures =
    "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";

absl::string_view ModelTypeName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
  }
  return "unknown";
}

// Reads fields of one JSON object, naming `source` and the key in errors.
class FieldReader {
 public:
  FieldReader(const json& object, absl::string_view source)
      : object_(object), source_(source) {}

  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": ", key, " ", what));
  }

  bool Has(const char* key) const {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }

  absl::StatusOr<int64_t> Int(const char* key) const {
    if (!Has(key)) return Error(key, "is required but missing");
    const json& value = object_.at(key);
    if (!value.is_number_integer()) {
      return Error(key, absl::StrCat("must be an integer, got ", value.dump()));
    }
    return value.get<int64_t>();
  }
  absl::StatusOr<int64_t> Int(const char* key, int64_t fallback) const {
    if (!Has(key)) return fallback;
    return Int(key);
  }

  absl::StatusOr<double> Double(const char* key) const {
    if (!Has(key)) return Error(key, "is required but missing");
    const json& value = object_.at(key);
    if (!value.is_number()) {
      return Error(key, absl::StrCat("must be a number, got ", value.dump()));
    }
    return value.get<double>();
  }
  absl::StatusOr<double> Double(const char* key, double fallback) const {
    if (!Has(key)) return fallback;
    return Double(key);
  }

  absl::StatusOr<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    const json& value = object_.at(key);
    if (!value.is_boolean()) {
      return Error(key,
                   absl::StrCat("must be true or false, got ", value.dump()));
    }
    return value.get<bool>();
  }

  absl::StatusOr<std::string> String(const char* key,
                                     std::string fallback) const {
    if (!Has(key)) return fallback;
    const json& value = object_.at(key);
    if (!value.is_string()) {
      return Error(key, absl::StrCat("must be a string, got ", value.dump()));
    }
    return value.get<std::string>();
  }

 private:
  const json& object_;
  absl::string_view source_;
};

absl::StatusOr<Architecture> ParseArchitecture(const json& root,
                                               absl::string_view source) {
  auto it = root.find("architectures");
  if (it == root.end() || !it->is_array() || it->size() != 1 ||
      !(*it)[0].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": architectures must be a list of one name (one of ",
        kSupportedArchitectures, "), got ",
        it == root.end() ? std::string("nothing") : it->dump()));
  }
  const std::string name = (*it)[0].get<std::string>();
  for (Architecture arch :
       {Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3}) {
    if (name == ArchitectureName(arch)) return arch;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": architectures ['", name,
      "'] is not supported; expected one of ", kSupportedArchitectures));
}

// The rotary parameters of config.json. transformers >= 5 writes one
// `rope_parameters` object ({"rope_type", "rope_theta", and the scaling
// fields}) and no top-level `rope_theta` / `rope_scaling`; older versions
// write those two. As transformers does, a non-null `rope_scaling` takes
// precedence over `rope_parameters`, and the object's `rope_theta` over the
// top-level one.
absl::Status ParseRope(const json& root, absl::string_view source,
                       ModelConfig* config) {
  std::string key = "rope_scaling";
  auto it = root.find(key);
  if (it == root.end() || it->is_null() || (it->is_object() && it->empty())) {
    key = "rope_parameters";
    it = root.find(key);
  }
  const std::string where = absl::StrCat(source, ": ", key);
  FieldReader top(root, source);
  ASSIGN_OR_RETURN(config->rope_theta, top.Double("rope_theta", 10000.0));
  config->rope_scaling.reset();
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " must be an object or null, got ", it->dump()));
  }
  for (const auto& [name, value] : it->items()) {
    if (value.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": parameters per layer type ('", name,
                       "') are not supported"));
    }
  }
  FieldReader fields(*it, where);
  ASSIGN_OR_RETURN(config->rope_theta,
                   fields.Double("rope_theta", config->rope_theta));
  // transformers spells the type "rope_type" (new) or "type" (old).
  ASSIGN_OR_RETURN(std::string type, fields.String("rope_type", ""));
  if (type.empty()) {
    ASSIGN_OR_RETURN(type, fields.String("type", ""));
  }
  if (type.empty() || type == "default") return absl::OkStatus();
  if (type != "llama3") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": type '", type,
                     "' is not supported; only 'llama3' (and 'default') are"));
  }
  RopeScaling scaling;
  ASSIGN_OR_RETURN(scaling.factor, fields.Double("factor"));
  ASSIGN_OR_RETURN(scaling.low_freq_factor, fields.Double("low_freq_factor"));
  ASSIGN_OR_RETURN(scaling.high_freq_factor, fields.Double("high_freq_factor"));
  ASSIGN_OR_RETURN(scaling.original_max_position_embeddings,
                   fields.Int("original_max_position_embeddings"));
  config->rope_scaling = scaling;
  return absl::OkStatus();
}

absl::StatusOr<WeightDType> ParseDType(const FieldReader& fields) {
  // transformers >= 4.56 writes "dtype", older versions "torch_dtype".
  const char* key = fields.Has("torch_dtype") ? "torch_dtype" : "dtype";
  ASSIGN_OR_RETURN(std::string name, fields.String(key, "float32"));
  if (name == "float32" || name == "float16") return WeightDType::kFloat32;
  if (name == "bfloat16") return WeightDType::kBFloat16;
  return fields.Error(
      key,
      absl::StrCat("must be float32, bfloat16 or float16, got '", name, "'"));
}

absl::Status ParseTokenIds(const json& root, absl::string_view source,
                           ModelConfig* config) {
  auto bos = root.find("bos_token_id");
  if (bos != root.end() && bos->is_number_integer()) {
    config->bos_token_id = bos->get<int64_t>();
  }
  auto eos = root.find("eos_token_id");
  if (eos == root.end() || eos->is_null()) return absl::OkStatus();
  if (eos->is_number_integer()) {
    config->eos_token_ids.push_back(eos->get<int64_t>());
    return absl::OkStatus();
  }
  if (eos->is_array()) {
    for (const json& id : *eos) {
      if (!id.is_number_integer()) break;
      config->eos_token_ids.push_back(id.get<int64_t>());
    }
    if (config->eos_token_ids.size() == eos->size()) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": eos_token_id must be an integer or a list of integers, got ",
      eos->dump()));
}

}  // namespace

absl::string_view ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "unknown";
}

absl::string_view WeightDTypeName(WeightDType dtype) {
  return dtype == WeightDType::kBFloat16 ? "bfloat16" : "float32";
}

absl::Status ValidateModelConfig(const ModelConfig& c,
                                 absl::string_view source) {
  auto error = [&](const std::string& message) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
  };
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings},
  };
  for (const auto& [name, value] : positive) {
    if (value <= 0) {
      return error(absl::StrCat(name, " must be > 0, got ", value));
    }
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return error(absl::StrCat("num_key_value_heads (", c.num_key_value_heads,
                              ") must divide num_attention_heads (",
                              c.num_attention_heads, ")"));
  }
  if (c.head_dim % 2 != 0) {
    return error(
        absl::StrCat("head_dim must be even for RoPE, got ", c.head_dim));
  }
  if (!(c.rms_norm_eps > 0)) {
    return error(
        absl::StrCat("rms_norm_eps must be > 0, got ", c.rms_norm_eps));
  }
  if (!(c.rope_theta > 0)) {
    return error(absl::StrCat("rope_theta must be > 0, got ", c.rope_theta));
  }
  if (c.rope_scaling.has_value()) {
    const RopeScaling& s = *c.rope_scaling;
    if (!(s.factor > 0) || !(s.low_freq_factor > 0) ||
        !(s.high_freq_factor > s.low_freq_factor) ||
        s.original_max_position_embeddings <= 0) {
      return error(absl::StrCat(
          "rope_scaling needs factor > 0, 0 < low_freq_factor < "
          "high_freq_factor and original_max_position_embeddings > 0, got "
          "factor ",
          s.factor, ", low_freq_factor ", s.low_freq_factor,
          ", high_freq_factor ", s.high_freq_factor,
          ", original_max_position_embeddings ",
          s.original_max_position_embeddings));
    }
  }
  for (int64_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return error(absl::StrCat("eos_token_id ", id, " is outside [0, ",
                                c.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source) {
  json root = json::parse(json_text.begin(), json_text.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": expected a JSON object, got ", root.type_name()));
  }
  ModelConfig config;
  ASSIGN_OR_RETURN(config.architecture, ParseArchitecture(root, source));
  FieldReader fields(root, source);
  ASSIGN_OR_RETURN(std::string model_type, fields.String("model_type", ""));
  if (!model_type.empty() && model_type != ModelTypeName(config.architecture)) {
    return fields.Error("model_type",
                        absl::StrCat("'", model_type, "' does not match ",
                                     ArchitectureName(config.architecture)));
  }
  ASSIGN_OR_RETURN(std::string act, fields.String("hidden_act", "silu"));
  if (act != "silu") {
    return fields.Error("hidden_act", absl::StrCat("'", act,
                                                   "' is not supported; only "
                                                   "'silu' (SwiGLU) is"));
  }
  ASSIGN_OR_RETURN(config.vocab_size, fields.Int("vocab_size"));
  ASSIGN_OR_RETURN(config.hidden_size, fields.Int("hidden_size"));
  ASSIGN_OR_RETURN(config.intermediate_size, fields.Int("intermediate_size"));
  ASSIGN_OR_RETURN(config.num_hidden_layers, fields.Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(config.num_attention_heads,
                   fields.Int("num_attention_heads"));
  ASSIGN_OR_RETURN(
      config.num_key_value_heads,
      fields.Int("num_key_value_heads", config.num_attention_heads));
  if (config.num_attention_heads <= 0) {
    return fields.Error(
        "num_attention_heads",
        absl::StrCat("must be > 0, got ", config.num_attention_heads));
  }
  const bool divides = config.hidden_size % config.num_attention_heads == 0;
  ASSIGN_OR_RETURN(
      config.head_dim,
      fields.Int(
          "head_dim",
          divides ? config.hidden_size / config.num_attention_heads : 0));
  if (config.head_dim == 0) {
    return fields.Error("head_dim",
                        absl::StrCat("is missing and num_attention_heads (",
                                     config.num_attention_heads,
                                     ") does not divide hidden_size (",
                                     config.hidden_size, ")"));
  }
  ASSIGN_OR_RETURN(config.rms_norm_eps, fields.Double("rms_norm_eps", 1e-6));
  RETURN_IF_ERROR(ParseRope(root, source, &config));
  ASSIGN_OR_RETURN(config.max_position_embeddings,
                   fields.Int("max_position_embeddings", 2048));
  ASSIGN_OR_RETURN(config.tie_word_embeddings,
                   fields.Bool("tie_word_embeddings", false));
  ASSIGN_OR_RETURN(config.dtype, ParseDType(fields));
  // Qwen2 and Qwen3 configs carry sliding-window fields that are inactive
  // unless use_sliding_window is true.
  ASSIGN_OR_RETURN(bool sliding, fields.Bool("use_sliding_window", false));
  if (sliding) {
    return fields.Error("use_sliding_window",
                        "true is not supported (sliding-window attention)");
  }
  switch (config.architecture) {
    case Architecture::kQwen2:
      config.attention_bias = true;
      break;
    case Architecture::kQwen3:
      config.qk_norm = true;
      [[fallthrough]];
    case Architecture::kLlama: {
      ASSIGN_OR_RETURN(config.attention_bias,
                       fields.Bool("attention_bias", false));
      ASSIGN_OR_RETURN(bool mlp_bias, fields.Bool("mlp_bias", false));
      if (mlp_bias) {
        return fields.Error("mlp_bias", "true is not supported");
      }
      break;
    }
  }
  RETURN_IF_ERROR(ParseTokenIds(root, source, &config));
  RETURN_IF_ERROR(ValidateModelConfig(config, source));
  config.raw = std::move(root);
  return config;
}

absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/config.json");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::DataLossError(absl::StrCat(path, ": read failed"));
  }
  return ParseModelConfig(text.str(), path);
}

nlohmann::json ModelConfigToJson(const ModelConfig& c) {
  json out = c.raw.is_object() ? c.raw : json::object();
  out["architectures"] =
      json::array({std::string(ArchitectureName(c.architecture))});
  out["model_type"] = std::string(ModelTypeName(c.architecture));
  out["vocab_size"] = c.vocab_size;
  out["hidden_size"] = c.hidden_size;
  out["intermediate_size"] = c.intermediate_size;
  out["num_hidden_layers"] = c.num_hidden_layers;
  out["num_attention_heads"] = c.num_attention_heads;
  out["num_key_value_heads"] = c.num_key_value_heads;
  out["head_dim"] = c.head_dim;
  out["hidden_act"] = "silu";
  out["rms_norm_eps"] = c.rms_norm_eps;
  out["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.has_value()) {
    out["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling->factor},
        {"low_freq_factor", c.rope_scaling->low_freq_factor},
        {"high_freq_factor", c.rope_scaling->high_freq_factor},
        {"original_max_position_embeddings",
         c.rope_scaling->original_max_position_embeddings}};
  } else {
    out["rope_scaling"] = nullptr;
  }
  // A config read from transformers >= 5 keeps its `rope_parameters`, which
  // transformers reads when `rope_scaling` is null: keep it in step.
  if (out.contains("rope_parameters")) {
    json rope = out["rope_scaling"].is_object()
                    ? out["rope_scaling"]
                    : json{{"rope_type", "default"}};
    rope["rope_theta"] = c.rope_theta;
    out["rope_parameters"] = std::move(rope);
  }
  out["max_position_embeddings"] = c.max_position_embeddings;
  out["tie_word_embeddings"] = c.tie_word_embeddings;
  out["torch_dtype"] = std::string(WeightDTypeName(c.dtype));
  if (out.contains("dtype")) out["dtype"] = out["torch_dtype"];
  if (c.architecture == Architecture::kQwen2) {
    out["use_sliding_window"] = false;
  } else {
    out["attention_bias"] = c.attention_bias;
    out["mlp_bias"] = false;
  }
  if (c.bos_token_id.has_value()) out["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) {
    out["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    out["eos_token_id"] = c.eos_token_ids;
  }
  out["use_cache"] = true;
  return out;
}

ModelConfig Qwen2_5_0_5BConfig() {
  ModelConfig c;
  c.architecture = Architecture::kQwen2;
  c.vocab_size = 151936;
  c.hidden_size = 896;
  c.intermediate_size = 4864;
  c.num_hidden_layers = 24;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.max_position_embeddings = 32768;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  c.dtype = WeightDType::kBFloat16;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151643};
  return c;
}

ModelConfig BuiltinTinyModelConfig(int64_t vocab_size) {
  ModelConfig c;
  c.architecture = Architecture::kQwen2;
  c.vocab_size = vocab_size;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 64;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  return c;
}

}  // namespace tandem::model
