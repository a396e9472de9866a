// Hugging Face directories: config.json parsing, save/load round trips of
// each architecture, and the errors for what we refuse.

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/model/decoder_model.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/safetensors/safetensors_writer.h"
#include "common/safetensors/sharded_checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/unit/model_test_util.h"

namespace tandem::model {
namespace {

using testing::TempDir;
using testing::TinyLlama3Config;
using testing::TinyQwen2Config;
using testing::TinyQwen3Config;

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

std::string ErrorOf(const absl::Status& status) {
  REQUIRE(!status.ok());
  return std::string(status.message());
}

at::Tensor Logits(std::shared_ptr<ModelWeights> weights) {
  DecoderModel model(std::move(weights));
  const at::Tensor ids = at::tensor({3, 14, 15, 92, 65, 35, 89, 79}, at::kLong);
  auto logits = model.ForwardPacked(ids, at::arange(8, at::kLong),
                                    at::tensor({0, 8}, at::kLong));
  REQUIRE(logits.ok());
  return *logits;
}

void CheckRoundTrip(const ModelConfig& config, const SaveOptions& options) {
  TempDir dir;
  auto weights = RandomInit(config, 3, {.stddev = 0.1, .norm_noise = 0.1});
  REQUIRE(weights.ok());
  REQUIRE(SaveHfModel(**weights, dir.path(), options).ok());
  auto loaded = LoadHfModel(dir.path());
  REQUIRE(loaded.ok());
  const ModelConfig& c = (*loaded)->config();
  CHECK(c.architecture == config.architecture);
  CHECK(c.head_dim == config.head_dim);
  CHECK(c.qk_norm == config.qk_norm);
  CHECK(c.attention_bias == config.attention_bias);
  CHECK(c.tie_word_embeddings == config.tie_word_embeddings);
  CHECK(c.rope_scaling.has_value() == config.rope_scaling.has_value());
  CHECK(c.eos_token_ids == config.eos_token_ids);
  CHECK(c.dtype == config.dtype);
  REQUIRE((*loaded)->tensors().size() == (*weights)->tensors().size());
  for (const auto& [name, t] : (*weights)->tensors()) {
    INFO(name);
    CHECK(at::equal(t, (*loaded)->tensors().at(name)));
  }
  CHECK(at::equal(Logits(*weights), Logits(*loaded)));
}

TEST_CASE("Qwen2-shaped checkpoint round-trips with identical logits",
          "[model][checkpoint]") {
  CheckRoundTrip(TinyQwen2Config(), {});
}

TEST_CASE("Qwen3-shaped checkpoint (q/k norm) round-trips",
          "[model][checkpoint]") {
  CheckRoundTrip(TinyQwen3Config(), {});
}

TEST_CASE("Llama-3-shaped checkpoint (rope scaling) round-trips",
          "[model][checkpoint]") {
  CheckRoundTrip(TinyLlama3Config(), {});
}

TEST_CASE("bf16 checkpoint round-trips", "[model][checkpoint]") {
  ModelConfig config = TinyQwen2Config();
  config.dtype = WeightDType::kBFloat16;
  CheckRoundTrip(config, {});
}

TEST_CASE("Large checkpoints are written sharded and load back",
          "[model][checkpoint]") {
  TempDir dir;
  auto weights = RandomInit(TinyQwen2Config(), 3);
  REQUIRE(weights.ok());
  // A first single-file save, then a sharded one into the same directory:
  // the stale model.safetensors must go.
  REQUIRE(SaveHfModel(**weights, dir.path()).ok());
  REQUIRE(SaveHfModel(**weights, dir.path(), {.max_shard_bytes = 40000}).ok());
  CHECK(std::filesystem::exists(dir.File("model.safetensors.index.json")));
  CHECK(!std::filesystem::exists(dir.File("model.safetensors")));
  auto checkpoint = safetensors::ShardedCheckpoint::Open(dir.path());
  REQUIRE(checkpoint.ok());
  CHECK((*checkpoint)->shards().size() > 1);
  auto loaded = LoadHfModel(dir.path());
  REQUIRE(loaded.ok());
  CHECK(at::equal(Logits(*weights), Logits(*loaded)));
}

// Overwrites the stored bytes of tensor `name` in the safetensors file at
// `path` with `fill(i)` for byte i of its data.
template <typename Fill>
void OverwriteTensorBytes(const std::string& path, const std::string& name,
                          Fill fill) {
  std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
  REQUIRE(file.good());
  uint64_t header_size = 0;
  file.read(reinterpret_cast<char*>(&header_size), 8);
  std::string header(header_size, '\0');
  file.read(header.data(), static_cast<std::streamsize>(header_size));
  const nlohmann::json j = nlohmann::json::parse(header);
  REQUIRE(j.contains(name));
  const uint64_t begin = j[name]["data_offsets"][0].get<uint64_t>();
  const uint64_t end = j[name]["data_offsets"][1].get<uint64_t>();
  std::string bytes(end - begin, '\0');
  for (uint64_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(fill(i));
  }
  file.seekp(static_cast<std::streamoff>(8 + header_size + begin));
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(file.good());
}

TEST_CASE("A checkpoint with a NaN in one tensor is refused naming file, "
          "tensor and element",
          "[model][checkpoint][finite]") {
  TempDir dir;
  auto weights = RandomInit(TinyQwen2Config(), 3);
  REQUIRE(weights.ok());
  REQUIRE(SaveHfModel(**weights, dir.path()).ok());
  // Element 5 of the final norm (F32 [64]) becomes a quiet NaN; every other
  // byte keeps its value.
  const std::string file = dir.File("model.safetensors");
  const std::vector<float> norm(
      (*weights)->tensors().at("model.norm.weight").data_ptr<float>(),
      (*weights)->tensors().at("model.norm.weight").data_ptr<float>() + 64);
  OverwriteTensorBytes(file, "model.norm.weight", [&norm](uint64_t i) {
    float v = i / 4 == 5 ? std::nanf("") : norm[i / 4];
    uint8_t b[4];
    std::memcpy(b, &v, 4);
    return b[i % 4];
  });
  const std::string error = ErrorOf(LoadHfModel(dir.path()).status());
  CHECK_THAT(error, Catch::Contains(file));
  CHECK_THAT(error, Catch::Contains("'model.norm.weight'"));
  CHECK_THAT(error, Catch::Contains("element 5 of 64 is NaN"));
}

TEST_CASE("Random bytes in a shard's tensor data are refused naming the "
          "shard and tensor",
          "[model][checkpoint][finite]") {
  TempDir dir;
  auto weights = RandomInit(TinyQwen2Config(), 3);
  REQUIRE(weights.ok());
  REQUIRE(SaveHfModel(**weights, dir.path(),
                      {.dtype = WeightDType::kBFloat16,
                       .max_shard_bytes = 20000})
              .ok());
  auto checkpoint = safetensors::ShardedCheckpoint::Open(dir.path());
  REQUIRE(checkpoint.ok());
  std::string shard;
  for (const auto& f : (*checkpoint)->shards()) {
    if (f->Find("model.embed_tokens.weight") != nullptr) shard = f->source();
  }
  REQUIRE(!shard.empty());
  checkpoint->reset();
  // What random bytes are: structurally valid (the header is untouched),
  // numerically garbage, including some Inf/NaN bit patterns.
  std::mt19937 rng(7);
  OverwriteTensorBytes(shard, "model.embed_tokens.weight",
                       [&rng](uint64_t) { return rng() & 0xFF; });
  const std::string error = ErrorOf(LoadHfModel(dir.path()).status());
  CHECK_THAT(error, Catch::Contains(shard));
  CHECK_THAT(error, Catch::Contains("'model.embed_tokens.weight' (BF16"));
  CHECK_THAT(error, Catch::Contains("non-finite"));
}

TEST_CASE(
    "Save converts dtype, keeps unknown config fields, copies the "
    "tokenizer",
    "[model][checkpoint]") {
  TempDir src, out;
  auto weights = RandomInit(TinyQwen2Config(), 3);
  REQUIRE(weights.ok());
  REQUIRE(SaveHfModel(**weights, src.path()).ok());
  // An extra field in config.json and a tokenizer next to it.
  nlohmann::json config =
      nlohmann::json::parse(std::ifstream(src.File("config.json")));
  config["initializer_range"] = 0.02;
  WriteText(src.File("config.json"), config.dump());
  WriteText(src.File("tokenizer.json"), "{\"version\": \"1.0\"}");
  auto loaded = LoadHfModel(src.path());
  REQUIRE(loaded.ok());
  REQUIRE(SaveHfModel(
              **loaded, out.path(),
              {.dtype = WeightDType::kBFloat16, .tokenizer_dir = src.path()})
              .ok());
  const nlohmann::json saved =
      nlohmann::json::parse(std::ifstream(out.File("config.json")));
  CHECK(saved["initializer_range"] == 0.02);
  CHECK(saved["torch_dtype"] == "bfloat16");
  CHECK(std::filesystem::exists(out.File("tokenizer.json")));
  auto bf16 = LoadHfModel(out.path());
  REQUIRE(bf16.ok());
  CHECK((*bf16)->dtype() == at::kBFloat16);
  // Loading with a dtype override converts back.
  auto fp32 = LoadHfModel(out.path(), {.dtype = WeightDType::kFloat32});
  REQUIRE(fp32.ok());
  CHECK((*fp32)->dtype() == at::kFloat);
}

TEST_CASE("Unsupported architecture is refused naming file and value",
          "[model][checkpoint]") {
  TempDir dir;
  WriteText(dir.File("config.json"),
            R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10})");
  const std::string error = ErrorOf(LoadHfModel(dir.path()).status());
  CHECK_THAT(error, Catch::Contains(dir.File("config.json")));
  CHECK_THAT(error, Catch::Contains("GPT2LMHeadModel"));
  CHECK_THAT(error, Catch::Contains("Qwen2ForCausalLM"));
}

TEST_CASE("config.json errors name the field", "[model][checkpoint]") {
  nlohmann::json base = ModelConfigToJson(TinyQwen2Config());
  SECTION("missing required field") {
    base.erase("hidden_size");
    CHECK_THAT(ErrorOf(ParseModelConfig(base.dump(), "c.json").status()),
               Catch::Contains("c.json: hidden_size is required"));
  }
  SECTION("unsupported rope scaling type") {
    base["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
    CHECK_THAT(ErrorOf(ParseModelConfig(base.dump(), "c.json").status()),
               Catch::Contains("type 'yarn' is not supported"));
  }
  SECTION("heads that do not divide") {
    base["num_key_value_heads"] = 3;
    CHECK_THAT(ErrorOf(ParseModelConfig(base.dump(), "c.json").status()),
               Catch::Contains("num_key_value_heads (3) must divide"));
  }
  SECTION("wrong type") {
    base["vocab_size"] = "97";
    CHECK_THAT(ErrorOf(ParseModelConfig(base.dump(), "c.json").status()),
               Catch::Contains("vocab_size must be an integer"));
  }
}

TEST_CASE("Llama-3 rope_scaling is parsed from config.json",
          "[model][checkpoint]") {
  const nlohmann::json json = ModelConfigToJson(TinyLlama3Config());
  auto parsed = ParseModelConfig(json.dump(), "c.json");
  REQUIRE(parsed.ok());
  REQUIRE(parsed->rope_scaling.has_value());
  CHECK(parsed->rope_scaling->original_max_position_embeddings == 64);
  CHECK(parsed->rope_scaling->factor == 8.0);
  CHECK(parsed->architecture == Architecture::kLlama);
  CHECK(parsed->bos_token_id == 2);
}

// transformers >= 5 writes the rotary parameters as one `rope_parameters`
// object and no top-level rope_theta / rope_scaling (this is the rope part
// of what LlamaConfig.save_pretrained writes in transformers 5.24).
TEST_CASE("transformers 5 rope_parameters give rope_theta and the scaling",
          "[model][checkpoint]") {
  nlohmann::json base = ModelConfigToJson(TinyLlama3Config());
  base.erase("rope_theta");
  base.erase("rope_scaling");
  base["rope_parameters"] = {
      {"factor", 8.0},          {"high_freq_factor", 4.0},
      {"low_freq_factor", 1.0}, {"original_max_position_embeddings", 16},
      {"rope_theta", 50000.0},  {"rope_type", "llama3"}};
  auto parsed = ParseModelConfig(base.dump(), "c.json");
  REQUIRE(parsed.ok());
  CHECK(parsed->rope_theta == 50000.0);
  REQUIRE(parsed->rope_scaling.has_value());
  CHECK(parsed->rope_scaling->original_max_position_embeddings == 16);

  // Written back, both spellings agree, and the result parses the same.
  const nlohmann::json written = ModelConfigToJson(*parsed);
  CHECK(written["rope_theta"] == 50000.0);
  CHECK(written["rope_parameters"]["rope_theta"] == 50000.0);
  CHECK(written["rope_parameters"]["rope_type"] == "llama3");
  auto again = ParseModelConfig(written.dump(), "c.json");
  REQUIRE(again.ok());
  CHECK(again->rope_theta == 50000.0);
  CHECK(again->rope_scaling.has_value());

  SECTION("default type: no scaling, the object's theta") {
    base["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}};
    auto plain = ParseModelConfig(base.dump(), "c.json");
    REQUIRE(plain.ok());
    CHECK(plain->rope_theta == 1e6);
    CHECK(!plain->rope_scaling.has_value());
  }
  SECTION("unsupported type is named") {
    base["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    CHECK_THAT(
        ErrorOf(ParseModelConfig(base.dump(), "c.json").status()),
        Catch::Contains("rope_parameters: type 'yarn' is not supported"));
  }
  SECTION("parameters per layer type are refused, not ignored") {
    base["rope_parameters"] = {
        {"full_attention", {{"rope_theta", 1e6}, {"rope_type", "default"}}}};
    CHECK_THAT(ErrorOf(ParseModelConfig(base.dump(), "c.json").status()),
               Catch::Contains("per layer type ('full_attention')"));
  }
}

// Published config.json files of real checkpoints, verbatim.
constexpr char kQwen25_05BConfig[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
  "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.1",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kLlama32_1BConfig[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 128000,
  "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
                   "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192,
                   "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
  "use_cache": true, "vocab_size": 128256})";

constexpr char kQwen3_06BConfig[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

int64_t ParameterCount(const ModelConfig& config) {
  int64_t n = 0;
  for (const ExpectedTensor& e : ExpectedTensors(config)) {
    int64_t numel = 1;
    for (int64_t d : e.shape) numel *= d;
    n += numel;
  }
  return n;
}

TEST_CASE("Real config.json files parse to their published sizes",
          "[model][checkpoint]") {
  auto qwen2 = ParseModelConfig(kQwen25_05BConfig, "qwen2.5");
  REQUIRE(qwen2.ok());
  CHECK(qwen2->attention_bias);
  CHECK(qwen2->head_dim == 64);
  CHECK(qwen2->dtype == WeightDType::kBFloat16);
  CHECK(qwen2->eos_token_ids == std::vector<int64_t>{151645});
  // Hugging Face lists Qwen2.5-0.5B at 494,032,768 parameters.
  CHECK(ParameterCount(*qwen2) == 494032768);
  CHECK(ParameterCount(Qwen2_5_0_5BConfig()) == 494032768);

  auto llama = ParseModelConfig(kLlama32_1BConfig, "llama3.2");
  REQUIRE(llama.ok());
  REQUIRE(llama->rope_scaling.has_value());
  CHECK(llama->rope_scaling->factor == 32.0);
  CHECK(llama->rms_norm_eps == 1e-5);
  CHECK(!llama->attention_bias);
  // Llama-3.2-1B: 1.24B parameters (tied embeddings).
  CHECK(ParameterCount(*llama) == 1235814400);

  auto qwen3 = ParseModelConfig(kQwen3_06BConfig, "qwen3");
  REQUIRE(qwen3.ok());
  CHECK(qwen3->qk_norm);
  CHECK(qwen3->head_dim == 128);
  CHECK(qwen3->rope_theta == 1000000.0);
  // Qwen3-0.6B: 596M parameters (tied embeddings).
  CHECK(ParameterCount(*qwen3) == 596049920);
}

// Writes config.json for `config` and model.safetensors holding `tensors`.
void WriteCheckpoint(const TempDir& dir, const ModelConfig& config,
                     const std::map<std::string, at::Tensor>& tensors) {
  WriteText(dir.File("config.json"), ModelConfigToJson(config).dump());
  std::vector<safetensors::TensorToWrite> to_write;
  for (const auto& [name, t] : tensors) {
    to_write.push_back(
        {name,
         safetensors::DType::kF32,
         std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
         {static_cast<const uint8_t*>(t.data_ptr()),
          static_cast<size_t>(t.numel() * 4)}});
  }
  REQUIRE(safetensors::WriteSafetensors(dir.File("model.safetensors"), to_write)
              .ok());
}

TEST_CASE("Missing, mis-shaped and unexpected tensors are named",
          "[model][checkpoint]") {
  const ModelConfig config = TinyQwen2Config();
  auto weights = RandomInit(config, 3);
  REQUIRE(weights.ok());
  std::map<std::string, at::Tensor> tensors = (*weights)->tensors();
  TempDir dir;
  SECTION("missing") {
    tensors.erase("model.layers.1.self_attn.k_proj.bias");
    WriteCheckpoint(dir, config, tensors);
    const std::string error = ErrorOf(LoadHfModel(dir.path()).status());
    CHECK_THAT(error, Catch::Contains(
                          "'model.layers.1.self_attn.k_proj.bias' is missing "
                          "(expected shape [32])"));
  }
  SECTION("mis-shaped") {
    tensors["model.layers.0.mlp.up_proj.weight"] = at::zeros({64, 96});
    WriteCheckpoint(dir, config, tensors);
    const std::string error = ErrorOf(LoadHfModel(dir.path()).status());
    CHECK_THAT(error, Catch::Contains("'model.layers.0.mlp.up_proj.weight': "
                                      "expected shape [96,64], got [64,96]"));
  }
  SECTION("unexpected") {
    tensors["model.layers.2.mlp.up_proj.weight"] = at::zeros({96, 64});
    WriteCheckpoint(dir, config, tensors);
    CHECK_THAT(ErrorOf(LoadHfModel(dir.path()).status()),
               Catch::Contains("unexpected tensor "
                               "'model.layers.2.mlp.up_proj.weight'"));
  }
  SECTION("tied lm_head duplicate is tolerated") {
    tensors["lm_head.weight"] = tensors.at("model.embed_tokens.weight");
    WriteCheckpoint(dir, config, tensors);
    CHECK(LoadHfModel(dir.path()).ok());
  }
}

TEST_CASE("ModelWeights::Create rejects wrong dtype", "[model][checkpoint]") {
  auto weights = RandomInit(TinyQwen2Config(), 3);
  REQUIRE(weights.ok());
  std::map<std::string, at::Tensor> tensors = (*weights)->tensors();
  tensors["model.norm.weight"] = tensors["model.norm.weight"].to(at::kDouble);
  const std::string error = ErrorOf(
      ModelWeights::Create(TinyQwen2Config(), tensors, "test").status());
  CHECK_THAT(error, Catch::Contains("tensor 'model.norm.weight': expected "
                                    "dtype Float, got Double"));
}

}  // namespace
}  // namespace tandem::model
