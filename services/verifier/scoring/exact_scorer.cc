#include "services/verifier/scoring/exact_scorer.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::verifier {
namespace {

class ExactScorer final : public Scorer {
 public:
  absl::Status Validate(const ScoreRequest& request) const override {
    std::string answer;
    RETURN_IF_ERROR(RequireMetadata(request, "answer", &answer));
    bool case_sensitive = true;
    return ReadBoolOption(request, "case_sensitive", true, &case_sensitive);
  }

  ScoreResult Score(const ScoreRequest& request) override {
    if (absl::Status status = Validate(request); !status.ok()) {
      return InvalidRequestResult(status);
    }
    bool case_sensitive = true;
    (void)ReadBoolOption(request, "case_sensitive", true, &case_sensitive);
    const absl::string_view want =
        absl::StripAsciiWhitespace(request.metadata.at("answer"));
    const absl::string_view got =
        absl::StripAsciiWhitespace(request.completion_text);
    if (got.empty() && !want.empty()) {
      return MakeResult(0.0, kOutcomeNoAnswer, "completion is empty");
    }
    const bool equal =
        case_sensitive ? got == want : absl::EqualsIgnoreCase(got, want);
    if (equal) {
      return MakeResult(
          1.0, kOutcomeCorrect,
          absl::StrCat("completion equals ", QuoteForReason(want)));
    }
    return MakeResult(
        0.0, kOutcomeIncorrect,
        absl::StrCat("completion ", QuoteForReason(got), " differs from ",
                     QuoteForReason(want),
                     case_sensitive ? "" : " (case-insensitive)"));
  }
};

}  // namespace

std::unique_ptr<Scorer> NewExactScorer() {
  return std::make_unique<ExactScorer>();
}

}  // namespace tandem::verifier
