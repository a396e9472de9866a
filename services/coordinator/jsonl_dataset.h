#pragma once

// JSONL prompt datasets. Each non-blank line is one JSON object:
//
//   {"id": "gsm8k-17",                  optional; default "<file>:<line>"
//    "prompt": "What is 2+3?",          text, tokenized with dataset.tokenizer
//    "prompt_token_ids": [1, 2, 3],     or token ids (used when both given)
//    "verifier": "math",                required: the verifier's name
//    "metadata": {"answer": "5"},       optional; string values only
//    "reference_completion": "5",       optional: a correct completion, as
//                                       text (needs dataset.tokenizer) or
//                                       "reference_completion_ids": [...];
//                                       the trainer's
//                                       training.guide_failed_groups uses it
//    "environment": "calculator"}       optional: a multi-turn task whose
//                                       episodes this environment runs
//                                       (docs/environments.md); absent or
//                                       "" = single-turn
//
// Other keys are ignored. A malformed line is reported as
// "<file>:<line>: <what is wrong>"; with bad_lines "skip" it is logged and
// left out, with "refuse" loading fails on the first one. Duplicate ids are
// malformed lines too.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "services/coordinator/coordinator_config.h"
#include "services/coordinator/prompt_source.h"

namespace tandem::coordinator {

struct JsonlDataset {
  std::vector<Prompt> prompts;
  // One message per skipped line, "<file>:<line>: ...".
  std::vector<std::string> skipped;
};

// Parses JSONL `text`; `file_name` prefixes messages. `tokenizer` may be
// null when every line carries prompt_token_ids.
absl::StatusOr<JsonlDataset> ParseJsonlDataset(
    const std::string& text, const std::string& file_name,
    const tokenizer::Tokenizer* tokenizer, bool skip_bad_lines);

// Reads and parses `options.path`, loading `options.tokenizer` if set.
absl::StatusOr<JsonlDataset> LoadJsonlDataset(const DatasetOptions& options);

// A source over a parsed dataset: `epochs` passes (0 = unbounded), each in
// a seeded shuffled order (or file order). The order of epoch e depends only
// on (seed, e) and the dataset.
std::unique_ptr<PromptSource> NewJsonlPromptSource(
    JsonlDataset dataset, const DatasetOptions& options,
    std::string description);

// LoadJsonlDataset + NewJsonlPromptSource; skipped lines are logged.
absl::StatusOr<std::unique_ptr<PromptSource>> NewJsonlPromptSource(
    const DatasetOptions& options);

}  // namespace tandem::coordinator
