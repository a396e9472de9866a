#include "services/verifier/scoring/math_scorer.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/base/status_macros.h"
#include "services/verifier/scoring/answer_parsing.h"

namespace tandem::verifier {
namespace {

absl::string_view SourceName(AnswerSource source) {
  switch (source) {
    case AnswerSource::kBoxed:
      return "\\boxed";
    case AnswerSource::kAnswerPhrase:
      return "answer phrase";
    case AnswerSource::kLastNumber:
      return "last number";
  }
  return "unknown";
}

std::string CanonicalText(absl::string_view text) {
  std::string normalized = NormalizeAnswer(text);
  normalized.erase(
      std::remove_if(normalized.begin(), normalized.end(),
                     [](unsigned char c) { return absl::ascii_isspace(c); }),
      normalized.end());
  return normalized;
}

class MathScorer final : public Scorer {
 public:
  absl::Status Validate(const ScoreRequest& request) const override {
    std::string answer;
    RETURN_IF_ERROR(RequireMetadata(request, "answer", &answer));
    if (absl::StripAsciiWhitespace(answer).empty()) {
      return absl::InvalidArgumentError("metadata.answer must not be empty");
    }
    return absl::OkStatus();
  }

  ScoreResult Score(const ScoreRequest& request) override {
    if (absl::Status status = Validate(request); !status.ok()) {
      return InvalidRequestResult(status);
    }
    const std::string& expected = request.metadata.at("answer");
    std::optional<ExtractedAnswer> extracted =
        ExtractFinalAnswer(request.completion_text);
    if (!extracted) {
      return MakeResult(0.0, kOutcomeNoAnswer,
                        "no \\boxed{}, answer phrase or number in completion");
    }
    const std::string got = QuoteForReason(extracted->text);
    const std::string how =
        absl::StrCat(" (from ", SourceName(extracted->source), ")");

    std::optional<AnswerNumber> want = ParseNumber(NormalizeAnswer(expected));
    if (want) {
      std::string candidate = NormalizeAnswer(extracted->text);
      std::optional<AnswerNumber> have = ParseNumber(candidate);
      if (!have) {
        const size_t eq = candidate.rfind('=');
        if (eq != std::string::npos) {
          have = ParseNumber(NormalizeAnswer(candidate.substr(eq + 1)));
        }
      }
      if (!have) {
        return MakeResult(
            0.0, kOutcomeIncorrect,
            absl::StrCat("answer ", got, how, " is not a number; expected ",
                         FormatNumber(*want)));
      }
      if (NumbersEqual(*want, *have)) {
        return MakeResult(
            1.0, kOutcomeCorrect,
            absl::StrCat("answer ", got, how, " equals ", FormatNumber(*want)));
      }
      return MakeResult(
          0.0, kOutcomeIncorrect,
          absl::StrCat("answer ", got, how, " = ", FormatNumber(*have),
                       ", expected ", FormatNumber(*want)));
    }

    const std::string want_text = CanonicalText(expected);
    if (!want_text.empty() && want_text == CanonicalText(extracted->text)) {
      return MakeResult(1.0, kOutcomeCorrect,
                        absl::StrCat("answer ", got, how, " matches"));
    }
    return MakeResult(0.0, kOutcomeIncorrect,
                      absl::StrCat("answer ", got, how, " differs from ",
                                   QuoteForReason(expected)));
  }
};

}  // namespace

std::unique_ptr<Scorer> NewMathScorer() {
  return std::make_unique<MathScorer>();
}

}  // namespace tandem::verifier
