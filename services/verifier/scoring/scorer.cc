#include "services/verifier/scoring/scorer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tandem::verifier {

absl::Status RequireMetadata(const ScoreRequest& request, absl::string_view key,
                             std::string* value) {
  auto it = request.metadata.find(std::string(key));
  if (it == request.metadata.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata.", key, " is required"));
  }
  *value = it->second;
  return absl::OkStatus();
}

absl::Status ReadBoolOption(const ScoreRequest& request, absl::string_view key,
                            bool default_value, bool* value) {
  auto it = request.metadata.find(std::string(key));
  if (it == request.metadata.end()) {
    *value = default_value;
    return absl::OkStatus();
  }
  const std::string text =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(it->second));
  if (text == "true" || text == "1") {
    *value = true;
  } else if (text == "false" || text == "0") {
    *value = false;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata.", key, " must be true or false, got ",
                     QuoteForReason(it->second)));
  }
  return absl::OkStatus();
}

ScoreResult MakeResult(double reward, absl::string_view outcome,
                       std::string reason) {
  ScoreResult result;
  result.reward = std::clamp(reward, 0.0, 1.0);
  result.outcome = std::string(outcome);
  result.reason = std::move(reason);
  return result;
}

ScoreResult InvalidRequestResult(const absl::Status& status) {
  return MakeResult(0.0, kOutcomeError,
                    absl::StrCat("invalid request: ", status.message()));
}

std::string QuoteForReason(absl::string_view text, size_t max_chars) {
  const bool truncated = text.size() > max_chars;
  if (truncated) text = text.substr(0, max_chars);
  return absl::StrCat("\"", absl::CHexEscape(text), truncated ? "...\"" : "\"");
}

}  // namespace tandem::verifier
