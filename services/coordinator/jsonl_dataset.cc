#include "services/coordinator/jsonl_dataset.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace tandem::coordinator {
namespace {

using Json = nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(what, ": cannot open \"", path, "\""));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Parses one line into `prompt`; returns an error message without location,
// or an empty string.
std::string ParseLine(const std::string& line,
                      const tokenizer::Tokenizer* tokenizer, Prompt* prompt) {
  Json json = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return "not valid JSON";
  if (!json.is_object()) return "a line must be a JSON object";
  if (json.contains("id")) {
    const Json& id = json["id"];
    if (id.is_string()) {
      prompt->id = id.get<std::string>();
    } else if (id.is_number_integer()) {
      prompt->id = std::to_string(id.get<int64_t>());
    } else {
      return "id must be a string or an integer";
    }
    if (prompt->id.empty()) return "id must not be empty";
  }
  if (!json.contains("verifier") || !json["verifier"].is_string() ||
      json["verifier"].get<std::string>().empty()) {
    return "verifier must be a non-empty string (e.g. \"math\")";
  }
  prompt->verifier = json["verifier"].get<std::string>();
  if (json.contains("metadata")) {
    const Json& metadata = json["metadata"];
    if (!metadata.is_object()) return "metadata must be an object";
    for (const auto& [key, value] : metadata.items()) {
      if (!value.is_string()) {
        return absl::StrCat("metadata.", key, " must be a string");
      }
      prompt->metadata[key] = value.get<std::string>();
    }
  }
  if (json.contains("environment")) {
    if (!json["environment"].is_string()) {
      return "environment must be a string (e.g. \"calculator\")";
    }
    prompt->environment = json["environment"].get<std::string>();
    if (prompt->environment.size() > 128) {
      return "environment must be at most 128 bytes";
    }
  }
  if (json.contains("reward_range")) {
    const Json& range = json["reward_range"];
    if (prompt->environment.empty()) {
      return "reward_range needs an environment (a single-turn task is "
             "scored by its verifier, in [0, 1])";
    }
    if (!range.is_array() || range.size() != 2 || !range[0].is_number() ||
        !range[1].is_number()) {
      return absl::StrCat("reward_range must be [min, max], two numbers; got ",
                          range.dump().substr(0, 64));
    }
    const double min = range[0].get<double>();
    const double max = range[1].get<double>();
    if (std::string why = environment::RewardRangeError(min, max);
        !why.empty()) {
      return why;
    }
    prompt->reward_range = {min, max};
  }
  const bool has_text = json.contains("prompt");
  if (has_text) {
    if (!json["prompt"].is_string()) return "prompt must be a string";
    prompt->text = json["prompt"].get<std::string>();
  }
  if (json.contains("prompt_token_ids")) {
    const Json& ids = json["prompt_token_ids"];
    if (!ids.is_array() || ids.empty()) {
      return "prompt_token_ids must be a non-empty array of token ids";
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 ||
          ids[i].get<int64_t>() > INT32_MAX) {
        return absl::StrCat("prompt_token_ids[", i,
                            "] must be a non-negative 32-bit integer");
      }
      prompt->token_ids.push_back(static_cast<int32_t>(ids[i].get<int64_t>()));
    }
    if (tokenizer != nullptr) {
      for (size_t i = 0; i < prompt->token_ids.size(); ++i) {
        if (prompt->token_ids[i] >= tokenizer->vocab_size()) {
          return absl::StrCat("prompt_token_ids[", i,
                              "] = ", prompt->token_ids[i],
                              " is outside the tokenizer's vocabulary (",
                              tokenizer->vocab_size(), " ids)");
        }
      }
      if (!has_text) prompt->text = tokenizer->Decode(prompt->token_ids);
    }
  } else if (has_text) {
    if (tokenizer == nullptr) {
      return "prompt text needs dataset.tokenizer (or give "
             "prompt_token_ids)";
    }
    prompt->token_ids = tokenizer->Encode(prompt->text);
    if (prompt->token_ids.empty()) return "prompt tokenizes to no tokens";
  } else {
    return "each line needs prompt or prompt_token_ids";
  }
  if (json.contains("reference_completion_ids")) {
    const Json& ids = json["reference_completion_ids"];
    if (!ids.is_array() || ids.empty()) {
      return "reference_completion_ids must be a non-empty array of token ids";
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 ||
          ids[i].get<int64_t>() > INT32_MAX ||
          (tokenizer != nullptr &&
           ids[i].get<int64_t>() >= tokenizer->vocab_size())) {
        return absl::StrCat("reference_completion_ids[", i,
                            "] must be a token id of the vocabulary, got ",
                            ids[i].dump());
      }
      prompt->reference_completion_ids.push_back(
          static_cast<int32_t>(ids[i].get<int64_t>()));
    }
  } else if (json.contains("reference_completion")) {
    if (!json["reference_completion"].is_string()) {
      return "reference_completion must be a string";
    }
    if (tokenizer == nullptr) {
      return "reference_completion text needs dataset.tokenizer (or give "
             "reference_completion_ids)";
    }
    prompt->reference_completion_ids =
        tokenizer->Encode(json["reference_completion"].get<std::string>());
    if (prompt->reference_completion_ids.empty()) {
      return "reference_completion tokenizes to no tokens";
    }
  }
  return "";
}

// Fisher-Yates with splitmix64, so the order is the same with every
// standard library (std::shuffle's is implementation-defined).
std::vector<size_t> EpochOrder(size_t n, uint64_t seed, uint64_t epoch,
                               bool shuffle) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  if (!shuffle) return order;
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL + epoch + 1;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[next() % i]);
  return order;
}

class JsonlPromptSource : public PromptSource {
 public:
  JsonlPromptSource(JsonlDataset dataset, const DatasetOptions& options,
                    std::string description)
      : prompts_(std::move(dataset.prompts)),
        epochs_(static_cast<uint64_t>(options.epochs)),
        seed_(static_cast<uint64_t>(options.seed)),
        shuffle_(options.shuffle),
        description_(std::move(description)) {}

  std::optional<Prompt> Next() override {
    if (prompts_.empty()) return std::nullopt;
    const uint64_t epoch = cursor_ / prompts_.size();
    const uint64_t position = cursor_ % prompts_.size();
    if (epochs_ != 0 && epoch >= epochs_) return std::nullopt;
    if (position == 0 || order_epoch_ != epoch) {
      order_ = EpochOrder(prompts_.size(), seed_, epoch, shuffle_);
      order_epoch_ = epoch;
    }
    Prompt prompt = prompts_[order_[position]];
    if (epoch > 0) absl::StrAppend(&prompt.id, "@", epoch);
    ++cursor_;
    return prompt;
  }

  uint64_t cursor() const override { return cursor_; }
  std::string Describe() const override { return description_; }

 private:
  const std::vector<Prompt> prompts_;
  const uint64_t epochs_;
  const uint64_t seed_;
  const bool shuffle_;
  const std::string description_;
  uint64_t cursor_ = 0;
  std::vector<size_t> order_;
  uint64_t order_epoch_ = UINT64_MAX;
};

}  // namespace

absl::StatusOr<JsonlDataset> ParseJsonlDataset(
    const std::string& text, const std::string& file_name,
    const tokenizer::Tokenizer* tokenizer, bool skip_bad_lines) {
  JsonlDataset dataset;
  std::set<std::string> ids;
  size_t line_number = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    Prompt prompt;
    std::string error = ParseLine(line, tokenizer, &prompt);
    if (error.empty()) {
      if (prompt.id.empty()) {
        prompt.id = absl::StrCat(file_name, ":", line_number);
      }
      if (!ids.insert(prompt.id).second) {
        error = absl::StrCat("duplicate id \"", prompt.id, "\"");
      }
    }
    if (!error.empty()) {
      std::string message =
          absl::StrCat(file_name, ":", line_number, ": ", error);
      if (!skip_bad_lines) return absl::InvalidArgumentError(message);
      dataset.skipped.push_back(std::move(message));
      continue;
    }
    dataset.prompts.push_back(std::move(prompt));
  }
  if (dataset.prompts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": no usable prompts (", dataset.skipped.size(),
                     " malformed lines skipped)"));
  }
  return dataset;
}

absl::StatusOr<JsonlDataset> LoadJsonlDataset(const DatasetOptions& options) {
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  if (!options.tokenizer.empty()) {
    ASSIGN_OR_RETURN(tokenizer,
                     tokenizer::Tokenizer::FromFile(options.tokenizer));
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(options.path, "dataset.path"));
  return ParseJsonlDataset(text, options.path, tokenizer.get(),
                           options.bad_lines == "skip");
}

std::unique_ptr<PromptSource> NewJsonlPromptSource(
    JsonlDataset dataset, const DatasetOptions& options,
    std::string description) {
  return std::make_unique<JsonlPromptSource>(std::move(dataset), options,
                                             std::move(description));
}

absl::StatusOr<std::unique_ptr<PromptSource>> NewJsonlPromptSource(
    const DatasetOptions& options) {
  ASSIGN_OR_RETURN(JsonlDataset dataset, LoadJsonlDataset(options));
  auto log = ComponentLogger("coordinator");
  for (const std::string& message : dataset.skipped) {
    log->warn("skipped malformed dataset line: {}", message);
  }
  std::string description =
      absl::StrCat("jsonl ", options.path, " (", dataset.prompts.size(),
                   " prompts, ", dataset.skipped.size(), " lines skipped, ",
                   options.epochs == 0 ? std::string("unbounded")
                                       : absl::StrCat(options.epochs),
                   " epochs)");
  return NewJsonlPromptSource(std::move(dataset), options,
                              std::move(description));
}

}  // namespace tandem::coordinator
