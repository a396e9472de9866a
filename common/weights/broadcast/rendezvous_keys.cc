#include "common/weights/broadcast/rendezvous_keys.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::weights {

RendezvousKeys::RendezvousKeys(RendezvousLimits limits) : limits_(limits) {}

void RendezvousKeys::SetChangeListener(std::function<void()> listener) {
  absl::MutexLock lock(&listener_mu_);
  listener_ = std::move(listener);
}

void RendezvousKeys::Changed() {
  absl::MutexLock lock(&listener_mu_);
  if (listener_) listener_();
}

void RendezvousKeys::EnterScope(const std::string& scope) {
  {
    absl::MutexLock lock(&mu_);
    const bool used = scopes_.contains(scope);
    current_ = scope;
    absl::StatusOr<Scope*> entered = FindScope(scope, /*create=*/true);
    if (!entered.ok() || !used) return;  // retired: callers see why
    const uint64_t created = (*entered)->created;
    std::vector<std::string> older;
    for (const auto& [name, s] : scopes_) {
      if (s.created < created) older.push_back(name);
    }
    for (const std::string& name : older) RetireLocked(name);
  }
  Changed();
}

void RendezvousKeys::RetireScope(const std::string& scope) {
  {
    absl::MutexLock lock(&mu_);
    RetireLocked(scope);
  }
  Changed();
}

void RendezvousKeys::RetireLocked(const std::string& scope) {
  scopes_.erase(scope);
  if (std::find(retired_.begin(), retired_.end(), scope) == retired_.end()) {
    retired_.push_back(scope);
    while (static_cast<int>(retired_.size()) > limits_.max_retired_scopes) {
      retired_.pop_front();
    }
  }
}

int RendezvousKeys::live_scopes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(scopes_.size());
}

absl::StatusOr<RendezvousKeys::Scope*> RendezvousKeys::FindScope(
    const std::string& scope, bool create) {
  if (scope.empty()) {
    return absl::InvalidArgumentError("rendezvous: the scope is empty");
  }
  if (static_cast<int>(scope.size()) > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous: scope '", scope.substr(0, 64), "…' has ", scope.size(),
        " bytes, more than the limit of ", limits_.max_key_bytes));
  }
  auto it = scopes_.find(scope);
  if (it != scopes_.end()) return &it->second;
  if (std::find(retired_.begin(), retired_.end(), scope) != retired_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rendezvous scope '", scope,
        "' is retired (the trainer left that epoch; its keys are gone)"));
  }
  if (!create) return nullptr;
  if (static_cast<int>(scopes_.size()) >= limits_.max_scopes) {
    // The least recently created scope but the trainer's: an epoch the
    // trainer never formed.
    const std::string* oldest = nullptr;
    uint64_t oldest_created = 0;
    for (const auto& [name, s] : scopes_) {
      if (name != current_ && (oldest == nullptr || s.created < oldest_created)) {
        oldest = &name;
        oldest_created = s.created;
      }
    }
    if (oldest != nullptr) RetireLocked(std::string(*oldest));
  }
  if (static_cast<int>(scopes_.size()) >= limits_.max_scopes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous scope '", scope, "': ", scopes_.size(),
                     " scopes are live, the limit is ", limits_.max_scopes));
  }
  Scope& created = scopes_[scope];
  created.created = next_created_++;
  return &created;
}

absl::Status RendezvousKeys::CheckPut(const std::string& scope_name,
                                      const Scope& scope,
                                      const std::string& key,
                                      const std::string& value) const {
  const std::string where = absl::StrCat("rendezvous key '", key.substr(0, 128),
                                         "' in scope '", scope_name, "'");
  if (key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the key is empty"));
  }
  if (static_cast<int>(key.size()) > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": key of ", key.size(),
                     " bytes, more than the limit of ", limits_.max_key_bytes));
  }
  if (static_cast<int64_t>(value.size()) > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": value of ", value.size(), " bytes, more than the limit of ",
        limits_.max_value_bytes));
  }
  auto it = scope.keys.find(key);
  const int64_t old_bytes =
      it == scope.keys.end()
          ? 0
          : static_cast<int64_t>(it->first.size() + it->second.size());
  if (it == scope.keys.end() &&
      static_cast<int>(scope.keys.size()) >= limits_.max_keys_per_scope) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where, ": the scope holds ", scope.keys.size(),
                     " keys, the limit is ", limits_.max_keys_per_scope));
  }
  const int64_t bytes =
      scope.bytes - old_bytes + static_cast<int64_t>(key.size() + value.size());
  if (bytes > limits_.max_scope_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where, ": the scope would hold ", bytes,
                     " bytes, the limit is ", limits_.max_scope_bytes));
  }
  return absl::OkStatus();
}

void RendezvousKeys::Put(Scope* scope, const std::string& key,
                         std::string value) {
  auto it = scope->keys.find(key);
  if (it != scope->keys.end()) {
    scope->bytes -= static_cast<int64_t>(it->first.size() + it->second.size());
  }
  scope->bytes += static_cast<int64_t>(key.size() + value.size());
  scope->keys[key] = std::move(value);
}

absl::Status RendezvousKeys::Set(const std::string& scope,
                                 const std::string& key,
                                 const std::string& value) {
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Scope*> s = FindScope(scope, true);
    if (!s.ok()) return s.status();
    if (absl::Status ok = CheckPut(scope, **s, key, value); !ok.ok()) return ok;
    Put(*s, key, value);
  }
  Changed();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousKeys::Get(const std::string& scope,
                                                const std::string& key) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> s = FindScope(scope, false);
  if (!s.ok()) return s.status();
  if (*s != nullptr) {
    auto it = (*s)->keys.find(key);
    if (it != (*s)->keys.end()) return it->second;
  }
  return absl::NotFoundError(absl::StrCat(
      "rendezvous key '", key, "' is not set in scope '", scope, "'"));
}

absl::StatusOr<int64_t> RendezvousKeys::Add(const std::string& scope,
                                            const std::string& key,
                                            int64_t delta) {
  int64_t sum = 0;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Scope*> s = FindScope(scope, true);
    if (!s.ok()) return s.status();
    auto it = (*s)->keys.find(key);
    int64_t current = 0;
    if (it != (*s)->keys.end() && !absl::SimpleAtoi(it->second, &current)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rendezvous key '", key, "' in scope '", scope, "' holds '",
          it->second.substr(0, 32), "', not an integer to add to"));
    }
    sum = current + delta;
    const std::string value = absl::StrCat(sum);
    if (absl::Status ok = CheckPut(scope, **s, key, value); !ok.ok()) return ok;
    Put(*s, key, value);
  }
  Changed();
  return sum;
}

absl::StatusOr<std::string> RendezvousKeys::CompareSet(
    const std::string& scope, const std::string& key,
    const std::string& expected, const std::string& desired) {
  std::string now;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Scope*> s = FindScope(scope, true);
    if (!s.ok()) return s.status();
    auto it = (*s)->keys.find(key);
    const bool unset = it == (*s)->keys.end();
    if (unset && !expected.empty()) return expected;
    if (!unset && it->second != expected) return it->second;
    if (absl::Status ok = CheckPut(scope, **s, key, desired); !ok.ok()) {
      return ok;
    }
    Put(*s, key, desired);
    now = desired;
  }
  Changed();
  return now;
}

absl::StatusOr<bool> RendezvousKeys::Wait(const std::string& scope,
                                          const std::vector<std::string>& keys,
                                          absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  absl::Status failed;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<Scope*> s = FindScope(scope, false);
    if (!s.ok()) {
      failed = s.status();
      return true;
    }
    if (*s == nullptr) return keys.empty();
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) {
      return (*s)->keys.contains(k);
    });
  };
  const bool all = mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  if (!failed.ok()) return failed;
  return all;
}

absl::StatusOr<bool> RendezvousKeys::DeleteKey(const std::string& scope,
                                               const std::string& key) {
  bool deleted = false;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Scope*> s = FindScope(scope, false);
    if (!s.ok()) return s.status();
    if (*s == nullptr) return false;
    auto it = (*s)->keys.find(key);
    if (it != (*s)->keys.end()) {
      (*s)->bytes -= static_cast<int64_t>(it->first.size() + it->second.size());
      (*s)->keys.erase(it);
      deleted = true;
    }
  }
  if (deleted) Changed();
  return deleted;
}

absl::StatusOr<int64_t> RendezvousKeys::NumKeys(const std::string& scope) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> s = FindScope(scope, false);
  if (!s.ok()) return s.status();
  return *s == nullptr ? 0 : static_cast<int64_t>((*s)->keys.size());
}

}  // namespace tandem::weights
