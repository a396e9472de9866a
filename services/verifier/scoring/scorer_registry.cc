#include "services/verifier/scoring/scorer_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "services/verifier/scoring/arith_scorer.h"
#include "services/verifier/scoring/code_scorer.h"
#include "services/verifier/scoring/exact_scorer.h"
#include "services/verifier/scoring/math_scorer.h"
#include "services/verifier/scoring/regex_scorer.h"

namespace tandem::verifier {

absl::Status ScorerRegistry::Register(absl::string_view name, Factory factory) {
  if (name.empty()) {
    return absl::InvalidArgumentError("scorer name must not be empty");
  }
  if (!factory) {
    return absl::InvalidArgumentError(
        absl::StrCat("scorer \"", name, "\": factory must not be null"));
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] =
      factories_.emplace(std::string(name), std::move(factory));
  if (!inserted) {
    return absl::AlreadyExistsError(
        absl::StrCat("scorer \"", name, "\" is already registered"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Scorer>> ScorerRegistry::Create(
    absl::string_view name) const {
  Factory factory;
  {
    absl::MutexLock lock(&mu_);
    auto it = factories_.find(name);
    if (it != factories_.end()) factory = it->second;
  }
  if (!factory) {
    return absl::NotFoundError(
        absl::StrCat("unknown verifier \"", name,
                     "\"; known verifiers: ", absl::StrJoin(Names(), ", ")));
  }
  absl::StatusOr<std::unique_ptr<Scorer>> scorer = factory();
  if (!scorer.ok()) {
    return absl::Status(scorer.status().code(),
                        absl::StrCat("creating verifier \"", name,
                                     "\": ", scorer.status().message()));
  }
  if (*scorer == nullptr) {
    return absl::InternalError(
        absl::StrCat("factory of verifier \"", name, "\" returned null"));
  }
  return scorer;
}

std::vector<std::string> ScorerRegistry::Names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  names.reserve(factories_.size());
  for (const auto& [name, factory] : factories_) names.push_back(name);
  return names;
}

absl::Status RegisterBuiltinScorers(const BuiltinScorerConfig& config,
                                    ScorerRegistry* registry) {
  // One line per verifier.
  RETURN_IF_ERROR(registry->Register("arith", [] { return NewArithScorer(); }));
  RETURN_IF_ERROR(registry->Register(
      "code", [sandbox = config.sandbox] { return NewCodeScorer(sandbox); }));
  RETURN_IF_ERROR(registry->Register("exact", [] { return NewExactScorer(); }));
  RETURN_IF_ERROR(registry->Register("math", [] { return NewMathScorer(); }));
  RETURN_IF_ERROR(registry->Register("regex", [] { return NewRegexScorer(); }));
  return absl::OkStatus();
}

}  // namespace tandem::verifier
