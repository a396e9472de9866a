#include "common/model/model_loader.h"

#include <ATen/Parallel.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/task/arith_tokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::model {

absl::StatusOr<LoadedModel> LoadModel(const std::string& path, uint64_t seed,
                                      int32_t torch_threads) {
  if (torch_threads > 0) at::set_num_threads(torch_threads);
  LoadedModel loaded;
  std::shared_ptr<ModelWeights> weights;
  if (path.empty()) {
    ASSIGN_OR_RETURN(auto tokenizer, task::LoadArithTokenizer());
    loaded.tokenizer = std::move(tokenizer);
    ModelConfig config = BuiltinTinyModelConfig(loaded.tokenizer->vocab_size());
    if (auto eos = loaded.tokenizer->TokenId("<|eos|>")) {
      config.eos_token_ids = {*eos};
    }
    ASSIGN_OR_RETURN(weights, RandomInit(config, seed));
    loaded.description =
        absl::StrCat("built-in tiny model (random init, seed ", seed, ")");
  } else {
    ASSIGN_OR_RETURN(weights, LoadHfModel(path));
    ASSIGN_OR_RETURN(auto tokenizer,
                     tokenizer::Tokenizer::FromFile(path + "/tokenizer.json"));
    loaded.tokenizer = std::move(tokenizer);
    loaded.description = path;
  }
  for (int64_t id : weights->config().eos_token_ids) {
    loaded.eos_token_ids.push_back(static_cast<int32_t>(id));
  }
  loaded.max_tokens = weights->config().max_position_embeddings;
  loaded.decoder = std::make_shared<DecoderModel>(std::move(weights));
  return loaded;
}

}  // namespace tandem::model
