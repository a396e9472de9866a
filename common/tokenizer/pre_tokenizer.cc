#include "common/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"

namespace tandem::tokenizer {
namespace {

pcre2_code* Code(void* code) { return static_cast<pcre2_code*>(code); }

// Owns the per-call PCRE2 state. A larger JIT stack is created only when the
// default one (32 KiB on the machine stack) is exhausted.
class MatchState {
 public:
  explicit MatchState(const pcre2_code* code)
      : data_(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchState() {
    pcre2_match_data_free(data_);
    if (context_ != nullptr) pcre2_match_context_free(context_);
    if (jit_stack_ != nullptr) pcre2_jit_stack_free(jit_stack_);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;

  int Match(const pcre2_code* code, absl::string_view text, size_t offset) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    int rc =
        pcre2_match(code, subject, text.size(), offset, 0, data_, context_);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack_ == nullptr) {
      jit_stack_ = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
      context_ = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
      rc = pcre2_match(code, subject, text.size(), offset, 0, data_, context_);
    }
    return rc;
  }
  const PCRE2_SIZE* ovector() const { return pcre2_get_ovector_pointer(data_); }

 private:
  pcre2_match_data* data_;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(
    absl::string_view pattern, bool literal) {
  // PCRE2_UCP is meaningless for (and rejected with) a literal pattern.
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF |
                     (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                                   pattern.size(), options, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compile regex \"", pattern, "\" at offset ",
                     error_offset, ": ", reinterpret_cast<char*>(message)));
  }
  // JIT is an optimization only: without it pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<RegexSplitter>(new RegexSplitter(code));
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(Code(code_)); }

void RegexSplitter::Split(absl::string_view text, bool keep_gaps,
                          std::vector<absl::string_view>* pieces) const {
  if (text.empty()) return;
  MatchState state(Code(code_));
  size_t gap_start = 0;
  size_t offset = 0;
  while (offset < text.size()) {
    int rc = state.Match(Code(code_), text, offset);
    if (rc < 0) break;  // No match, or a resource limit: the rest is a gap.
    size_t start = state.ovector()[0];
    size_t end = state.ovector()[1];
    if (end == start) {
      // An empty match: search again one character later.
      char32_t cp;
      int len = DecodeUtf8(text.substr(start), &cp);
      offset = start + (len > 0 ? len : 1);
      continue;
    }
    if (keep_gaps && start > gap_start) {
      pieces->push_back(text.substr(gap_start, start - gap_start));
    }
    pieces->push_back(text.substr(start, end - start));
    gap_start = end;
    offset = end;
  }
  if (keep_gaps && gap_start < text.size()) {
    pieces->push_back(text.substr(gap_start));
  }
}

void PreTokenizer::Run(absl::string_view text,
                       std::vector<std::string>* words) const {
  if (text.empty()) return;
  std::vector<std::string> current;
  current.emplace_back(text);
  std::vector<std::string> next;
  std::vector<absl::string_view> pieces;
  for (const PreTokenizerStep& step : steps_) {
    next.clear();
    for (const std::string& word : current) {
      if (step.kind == PreTokenizerStep::Kind::kSplit) {
        pieces.clear();
        step.regex->Split(word, step.keep_gaps, &pieces);
        for (absl::string_view piece : pieces) next.emplace_back(piece);
        continue;
      }
      std::string prefixed;
      absl::string_view source = word;
      if (step.add_prefix_space && !word.empty() && word[0] != ' ') {
        prefixed = absl::StrCat(" ", word);
        source = prefixed;
      }
      pieces.clear();
      if (step.regex != nullptr) {
        step.regex->Split(source, /*keep_gaps=*/true, &pieces);
      } else {
        pieces.push_back(source);
      }
      for (absl::string_view piece : pieces) {
        next.push_back(ByteLevelEncode(piece));
      }
    }
    current.swap(next);
  }
  for (std::string& word : current) {
    if (!word.empty()) words->push_back(std::move(word));
  }
}

bool PreTokenizer::byte_level() const {
  for (const PreTokenizerStep& step : steps_) {
    if (step.kind == PreTokenizerStep::Kind::kByteLevel) return true;
  }
  return false;
}

}  // namespace tandem::tokenizer
