#include "services/verifier/scoring/arith_scorer.h"

#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::verifier {
namespace {

bool IsHorizontalSpace(char c) { return c == ' ' || c == '\t' || c == '\r'; }

absl::string_view TrimHorizontal(absl::string_view text) {
  while (!text.empty() && IsHorizontalSpace(text.front())) {
    text.remove_prefix(1);
  }
  while (!text.empty() && IsHorizontalSpace(text.back())) {
    text.remove_suffix(1);
  }
  return text;
}

// Canonical decimal form of "-?[0-9]+" (no leading zeros, no "-0"), or
// nullopt when `text` is not of that form.
std::optional<std::string> CanonicalInteger(absl::string_view text) {
  bool negative = false;
  if (!text.empty() && text.front() == '-') {
    negative = true;
    text.remove_prefix(1);
  }
  if (text.empty()) return std::nullopt;
  for (char c : text) {
    if (!absl::ascii_isdigit(c)) return std::nullopt;
  }
  while (text.size() > 1 && text.front() == '0') text.remove_prefix(1);
  if (text == "0") negative = false;
  return absl::StrCat(negative ? "-" : "", text);
}

class ArithScorer final : public Scorer {
 public:
  absl::Status Validate(const ScoreRequest& request) const override {
    std::string answer;
    RETURN_IF_ERROR(RequireMetadata(request, "answer", &answer));
    if (!CanonicalInteger(absl::StripAsciiWhitespace(answer))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata.answer must be an integer, got ", QuoteForReason(answer)));
    }
    auto it = request.metadata.find("end_marker");
    if (it != request.metadata.end() && it->second.empty()) {
      return absl::InvalidArgumentError(
          "metadata.end_marker must not be empty");
    }
    return absl::OkStatus();
  }

  ScoreResult Score(const ScoreRequest& request) override {
    if (absl::Status status = Validate(request); !status.ok()) {
      return InvalidRequestResult(status);
    }
    const std::string want = *CanonicalInteger(
        absl::StripAsciiWhitespace(request.metadata.at("answer")));

    absl::string_view text = request.completion_text;
    size_t end = text.find('\n');
    auto cut_at = [&](absl::string_view marker) {
      const size_t found = text.find(marker);
      if (found != absl::string_view::npos && found < end) end = found;
    };
    for (absl::string_view marker : kArithEndMarkers) cut_at(marker);
    auto extra = request.metadata.find("end_marker");
    if (extra != request.metadata.end()) cut_at(extra->second);
    text = TrimHorizontal(text.substr(0, end));

    if (text.empty()) {
      return MakeResult(0.0, kOutcomeNoAnswer, "completion has no integer");
    }
    std::optional<std::string> got = CanonicalInteger(text);
    if (!got) {
      return MakeResult(0.0, kOutcomeNoAnswer,
                        absl::StrCat("completion ", QuoteForReason(text),
                                     " is not an integer"));
    }
    if (*got == want) {
      return MakeResult(1.0, kOutcomeCorrect,
                        absl::StrCat("completion equals ", want));
    }
    return MakeResult(
        0.0, kOutcomeIncorrect,
        absl::StrCat("completion ", *got, " differs from ", want));
  }
};

}  // namespace

std::unique_ptr<Scorer> NewArithScorer() {
  return std::make_unique<ArithScorer>();
}

}  // namespace tandem::verifier
