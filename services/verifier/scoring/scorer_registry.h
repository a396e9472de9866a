#pragma once

// Maps verifier names ("math", "code", ...) to factories of Scorers.
//
// Adding a verifier is one new file (the scorer, with its New...Scorer()
// factory) plus one registration line in RegisterBuiltinScorers().
//
// There is no global registry: the verifier daemon owns one and passes it
// where needed, and tests build their own.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "services/verifier/scoring/sandbox.h"
#include "services/verifier/scoring/scorer.h"

namespace tandem::verifier {

class ScorerRegistry {
 public:
  using Factory = std::function<absl::StatusOr<std::unique_ptr<Scorer>>()>;

  ScorerRegistry() = default;
  ScorerRegistry(const ScorerRegistry&) = delete;
  ScorerRegistry& operator=(const ScorerRegistry&) = delete;

  // Registers `factory` under `name`. InvalidArgument for an empty name or
  // a null factory, AlreadyExists when the name is taken. Thread-safe.
  absl::Status Register(absl::string_view name, Factory factory);

  // Creates a new scorer by name. NotFound listing the known names when
  // `name` is not registered; the factory's own error otherwise (e.g. an
  // invalid sandbox config). Thread-safe; the factory runs without the
  // registry lock held.
  absl::StatusOr<std::unique_ptr<Scorer>> Create(absl::string_view name) const;

  // Registered names, sorted. Thread-safe.
  std::vector<std::string> Names() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, Factory, std::less<>> factories_ ABSL_GUARDED_BY(mu_);
};

// Configuration the built-in scorers need.
struct BuiltinScorerConfig {
  SandboxConfig sandbox;  // For "code".
};

// Registers math, exact, regex, arith and code. Fails (AlreadyExists) when
// one of the names is already taken. The config is copied into the
// factories; it is validated when "code" is created.
absl::Status RegisterBuiltinScorers(const BuiltinScorerConfig& config,
                                    ScorerRegistry* registry);

}  // namespace tandem::verifier
