#include "services/verifier/scoring/regex_scorer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::verifier {
namespace {

// Bounds on one match so that adversarial completions cannot make a
// backtracking pattern run for minutes.
constexpr uint32_t kMatchLimit = 1'000'000;
constexpr uint32_t kDepthLimit = 10'000;
constexpr uint32_t kHeapLimitKib = 16 * 1024;

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* context) const {
    pcre2_match_context_free(context);
  }
};
using CodePtr = std::unique_ptr<pcre2_code, CodeDeleter>;

std::string Pcre2Message(int error_code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(error_code, buffer, sizeof(buffer));
  if (n < 0) return absl::StrCat("PCRE2 error ", error_code);
  return std::string(reinterpret_cast<const char*>(buffer), n);
}

struct RegexOptions {
  std::string pattern;
  bool full_match = true;
  bool case_sensitive = true;
};

absl::StatusOr<RegexOptions> ReadOptions(const ScoreRequest& request) {
  RegexOptions options;
  RETURN_IF_ERROR(RequireMetadata(request, "pattern", &options.pattern));
  auto it = request.metadata.find("match");
  if (it != request.metadata.end()) {
    if (it->second == "full") {
      options.full_match = true;
    } else if (it->second == "search") {
      options.full_match = false;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata.match must be \"full\" or \"search\", got ",
                       QuoteForReason(it->second)));
    }
  }
  RETURN_IF_ERROR(
      ReadBoolOption(request, "case_sensitive", true, &options.case_sensitive));
  return options;
}

absl::StatusOr<CodePtr> Compile(const RegexOptions& options) {
  uint32_t flags = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  if (!options.case_sensitive) flags |= PCRE2_CASELESS;
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  CodePtr code(pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(options.pattern.data()),
      options.pattern.size(), flags, &error_code, &error_offset, nullptr));
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata.pattern does not compile at offset ",
                     error_offset, ": ", Pcre2Message(error_code)));
  }
  return code;
}

class RegexScorer final : public Scorer {
 public:
  absl::Status Validate(const ScoreRequest& request) const override {
    ASSIGN_OR_RETURN(RegexOptions options, ReadOptions(request));
    return Compile(options).status();
  }

  ScoreResult Score(const ScoreRequest& request) override {
    absl::StatusOr<RegexOptions> options = ReadOptions(request);
    if (!options.ok()) return InvalidRequestResult(options.status());
    absl::StatusOr<CodePtr> code = Compile(*options);
    if (!code.ok()) return InvalidRequestResult(code.status());

    std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data(
        pcre2_match_data_create_from_pattern(code->get(), nullptr));
    std::unique_ptr<pcre2_match_context, MatchContextDeleter> context(
        pcre2_match_context_create(nullptr));
    if (match_data == nullptr || context == nullptr) {
      return MakeResult(0.0, kOutcomeError, "PCRE2 out of memory");
    }
    pcre2_set_match_limit(context.get(), kMatchLimit);
    pcre2_set_depth_limit(context.get(), kDepthLimit);
    pcre2_set_heap_limit(context.get(), kHeapLimitKib);

    absl::string_view subject = request.completion_text;
    uint32_t match_flags = 0;
    if (options->full_match) {
      subject = absl::StripAsciiWhitespace(subject);
      match_flags = PCRE2_ANCHORED | PCRE2_ENDANCHORED;
    }
    const int rc = pcre2_match(
        code->get(), reinterpret_cast<PCRE2_SPTR>(subject.data()),
        subject.size(), 0, match_flags, match_data.get(), context.get());
    const char* mode = options->full_match ? "full match" : "search";
    if (rc >= 0) {
      return MakeResult(
          1.0, kOutcomeCorrect,
          absl::StrCat("completion matches pattern (", mode, ")"));
    }
    if (rc == PCRE2_ERROR_NOMATCH) {
      return MakeResult(0.0, kOutcomeIncorrect,
                        absl::StrCat("completion ", QuoteForReason(subject),
                                     " does not match pattern (", mode, ")"));
    }
    return MakeResult(0.0, kOutcomeError,
                      absl::StrCat("matching failed: ", Pcre2Message(rc)));
  }
};

}  // namespace

std::unique_ptr<Scorer> NewRegexScorer() {
  return std::make_unique<RegexScorer>();
}

}  // namespace tandem::verifier
