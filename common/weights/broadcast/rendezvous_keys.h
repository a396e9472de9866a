#pragma once

// The key-value space of broadcast rendezvous (what Gloo and NCCL keep in a
// c10d::Store), without LibTorch: RendezvousKeyspace is the interface,
// RendezvousKeys the trainer's in-process table behind the gRPC rendezvous
// service (services/trainer/rendezvous_service.h) and behind the trainer's
// own member of a group, and RendezvousClient (rendezvous_client.h) the
// same operations over gRPC for the other members. rendezvous_store.h turns
// either into a c10d::Store.
//
// Scopes: every key lives in a scope, the epoch's key prefix
// (BroadcastGroup.key_prefix), so that one epoch's keys never meet
// another's and can be dropped together. Scopes are created by their first
// use. The trainer enters a scope when it forms that epoch's group
// (EnterScope) and retires it when it leaves the epoch (RetireScope). A
// retired scope refuses every later call with FailedPrecondition, so a
// late member of an old epoch cannot write keys a member of a later one
// reads. Scopes of epochs the trainer never formed (the coordinator moved
// on first) are retired too: when the trainer enters a scope that members
// used first, every scope first used before it (the coordinator hands out
// one epoch at a time, so those are older epochs); and when a new scope
// would pass max_scopes, the least recently created one other than the
// trainer's current scope. (A scope the trainer creates itself retires
// nothing: a member of a newer epoch may have come first.)
//
// Limits (RendezvousLimits) bound what callers can make the trainer hold:
// live scopes (as above), keys per scope, bytes per scope, key and value
// size. Exceeding one is ResourceExhausted (counts) or InvalidArgument
// (sizes), naming the key and the limit.

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::weights {

class RendezvousKeyspace {
 public:
  virtual ~RendezvousKeyspace() = default;

  virtual absl::Status Set(const std::string& scope, const std::string& key,
                           const std::string& value) = 0;
  // NotFound when the key is not set.
  virtual absl::StatusOr<std::string> Get(const std::string& scope,
                                          const std::string& key) = 0;
  // Adds `delta` to the key's integer (decimal text; an unset key is 0) and
  // returns the sum.
  virtual absl::StatusOr<int64_t> Add(const std::string& scope,
                                      const std::string& key,
                                      int64_t delta) = 0;
  // c10d's compareSet: stores `desired` when the key holds `expected` (or
  // is unset and `expected` is empty) and returns what the key then holds;
  // an unset key with a non-empty `expected` returns `expected`.
  virtual absl::StatusOr<std::string> CompareSet(
      const std::string& scope, const std::string& key,
      const std::string& expected, const std::string& desired) = 0;
  // Waits at most `wait` for every key to be set; whether they are.
  virtual absl::StatusOr<bool> Wait(const std::string& scope,
                                    const std::vector<std::string>& keys,
                                    absl::Duration wait) = 0;
  virtual absl::StatusOr<bool> DeleteKey(const std::string& scope,
                                         const std::string& key) = 0;
  virtual absl::StatusOr<int64_t> NumKeys(const std::string& scope) = 0;
};

struct RendezvousLimits {
  // Gloo keeps a few keys per rank (its address, barrier counters), NCCL
  // one unique id; these leave room for groups of hundreds of ranks.
  int max_scopes = 16;
  int max_keys_per_scope = 4096;
  int64_t max_scope_bytes = 16 << 20;
  int max_key_bytes = 1024;  // also bounds the scope's own name
  int64_t max_value_bytes = 1 << 20;
  // Scopes remembered as retired (older ones are forgotten).
  int max_retired_scopes = 256;
};

// Thread-safe.
class RendezvousKeys : public RendezvousKeyspace {
 public:
  explicit RendezvousKeys(RendezvousLimits limits = {});

  // Called after every change of a key or scope (outside the table's
  // lock, under the listener's own): the gRPC service's held waits look
  // again. Empty to clear; after it returns the old one is not called.
  void SetChangeListener(std::function<void()> listener);

  // The trainer forms `scope`'s group (see the top of this file for the
  // scopes it retires).
  void EnterScope(const std::string& scope);
  // The trainer left `scope`: its keys are dropped and it refuses later
  // calls.
  void RetireScope(const std::string& scope);
  int live_scopes() const;

  absl::Status Set(const std::string& scope, const std::string& key,
                   const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& scope,
                                  const std::string& key) override;
  absl::StatusOr<int64_t> Add(const std::string& scope, const std::string& key,
                              int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(const std::string& scope,
                                         const std::string& key,
                                         const std::string& expected,
                                         const std::string& desired) override;
  absl::StatusOr<bool> Wait(const std::string& scope,
                            const std::vector<std::string>& keys,
                            absl::Duration wait) override;
  absl::StatusOr<bool> DeleteKey(const std::string& scope,
                                 const std::string& key) override;
  absl::StatusOr<int64_t> NumKeys(const std::string& scope) override;

 private:
  struct Scope {
    uint64_t created = 0;  // order of first use
    int64_t bytes = 0;
    absl::flat_hash_map<std::string, std::string> keys;
  };

  // The live scope (created when `create` and absent), or why not.
  absl::StatusOr<Scope*> FindScope(const std::string& scope, bool create)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks the key's size and, for a new key, the scope's counts.
  absl::Status CheckPut(const std::string& scope_name, const Scope& scope,
                        const std::string& key, const std::string& value) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Put(Scope* scope, const std::string& key, std::string value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireLocked(const std::string& scope)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed();

  const RendezvousLimits limits_;
  absl::Mutex listener_mu_;
  std::function<void()> listener_ ABSL_GUARDED_BY(listener_mu_);
  mutable absl::Mutex mu_;
  // Live scopes by name, with their keys.
  absl::flat_hash_map<std::string, Scope> scopes_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> retired_ ABSL_GUARDED_BY(mu_);
  uint64_t next_created_ ABSL_GUARDED_BY(mu_) = 0;
  std::string current_ ABSL_GUARDED_BY(mu_);  // the trainer's scope
};

}  // namespace tandem::weights
