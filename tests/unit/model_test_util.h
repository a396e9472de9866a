#pragma once

// Helpers shared by the model unit tests: tiny configs of each supported
// architecture, and the temporary directory of tests/support/temp_dir.h.

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "common/model/model_config.h"
#include "tests/support/temp_dir.h"

namespace tandem::model::testing {

using TempDir = ::tandem::testing::TempDir;

// Qwen2-shaped (q/k/v bias, tied embeddings), GQA 4:2.
inline ModelConfig TinyQwen2Config() {
  ModelConfig c;
  c.architecture = Architecture::kQwen2;
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 256;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  c.eos_token_ids = {1};
  return c;
}

// Qwen3-shaped: q/k norm, head_dim (24) not hidden / heads (16), no bias,
// untied head.
inline ModelConfig TinyQwen3Config() {
  ModelConfig c = TinyQwen2Config();
  c.architecture = Architecture::kQwen3;
  c.head_dim = 24;
  c.attention_bias = false;
  c.qk_norm = true;
  c.tie_word_embeddings = false;
  c.rope_theta = 1000000.0;
  return c;
}

// Llama-3-shaped: "llama3" rope scaling with a short original context so
// that the scaling changes the frequencies used by the tests; o_proj bias
// via attention_bias; GQA 4:1; untied head.
inline ModelConfig TinyLlama3Config() {
  ModelConfig c = TinyQwen2Config();
  c.architecture = Architecture::kLlama;
  c.num_key_value_heads = 1;
  c.attention_bias = true;
  c.tie_word_embeddings = false;
  c.rope_theta = 500000.0;
  c.rope_scaling = RopeScaling{.factor = 8.0,
                               .low_freq_factor = 1.0,
                               .high_freq_factor = 4.0,
                               .original_max_position_embeddings = 64};
  c.bos_token_id = 2;
  return c;
}

}  // namespace tandem::model::testing
