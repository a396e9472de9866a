#pragma once

// MemberRegistry is the coordinator's table of cluster members. Members
// register, heartbeat and deregister; ExpireSilent() declares dead every
// member whose last heartbeat is older than the timeout. A dead member's
// heartbeats are refused so it registers again under a new id. Thread-safe.
//
// Member ids are "<role>-<incarnation>-<n>": the incarnation is a random
// tag drawn once per coordinator start (NewIncarnationTag), so a member
// registering after a coordinator restart never gets the id of a member of
// an earlier start, whose leases and batches the journal replayed and whose
// old process may still heartbeat or submit under that id.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cluster/member_names.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

// A random tag (8 hex digits from the OS's entropy) for the member ids of
// one coordinator start.
std::string NewIncarnationTag();

class MemberRegistry {
 public:
  // Ids are "<role>-<incarnation>-<n>", or "<role>-<n>" when `incarnation`
  // is empty (tests).
  MemberRegistry(absl::Duration heartbeat_timeout, std::string incarnation);

  // Adds a member and returns its info (with a new member_id). `owner` is
  // the caller's certificate identity (a SPIFFE ID) with mutual TLS, empty
  // without: the new member id belongs to it (CheckOwner). A
  // previous_member_id that belongs to another identity is not honoured
  // (its leases are not the new member's); one that belongs to no identity
  // yet is claimed for `owner`.
  tandem::v1::MemberInfo Register(const tandem::v1::RegisterRequest& request,
                                  absl::Time now,
                                  const std::string& owner = "");
  // OK when `member_id` belongs to `owner` (or `owner` is empty: no TLS).
  // A member id no identity owns yet (not registered since this coordinator
  // started: a member of an earlier start whose leases the journal
  // replayed) is claimed for `owner` by this call, up to kMaxClaims such
  // ids. PermissionDenied naming the member id and its owner otherwise.
  absl::Status CheckOwner(const std::string& member_id,
                          const std::string& owner);
  // How many member ids that were never registered here CheckOwner claims
  // before it refuses more (each is a map entry an authenticated caller
  // could otherwise add without end).
  static constexpr size_t kMaxClaims = 4096;
  // Records a heartbeat. FailedPrecondition when the member is unknown,
  // dead or gone: it must register again.
  absl::Status Heartbeat(const tandem::v1::HeartbeatRequest& request,
                         absl::Time now);
  // Marks the member as left. NotFound when unknown.
  absl::Status Deregister(const std::string& member_id);
  // Declares dead every alive member silent for longer than the timeout and
  // returns them.
  std::vector<tandem::v1::MemberInfo> ExpireSilent(absl::Time now);
  // Every member that is not dead or left, plus dead and left members until
  // they are pruned (kept for `retention` so status shows them).
  std::vector<tandem::v1::MemberInfo> Snapshot() const;
  // Forgets dead and left members older than `retention`.
  void Prune(absl::Time now, absl::Duration retention);
  // True when the member is registered and alive or draining.
  bool IsLive(const std::string& member_id) const;
  // The members whose prompt leases `member_id` may submit samples for:
  // itself and, when it registered naming a previous_member_id that is no
  // longer live (declared dead, left, or unknown since a coordinator
  // restart replayed the leases from its journal), that member.
  std::vector<std::string> LeaseHolders(const std::string& member_id) const;
  // The role `member_id` registered as; ROLE_UNSPECIFIED when unknown.
  tandem::v1::Role RoleOf(const std::string& member_id) const;
  // gRPC addresses of alive members of `role`.
  std::vector<std::string> LiveAddresses(tandem::v1::Role role) const;
  // Live members by role.
  std::map<tandem::v1::Role, int> CountAlive() const;

  // A verifier member that can take work, with the verifier names it
  // advertised at registration (capability "verifiers", a comma list; empty
  // when it advertised none).
  struct ServingVerifier {
    std::string address;
    std::set<std::string> verifiers;
  };
  // Alive (not draining) verifier members with a gRPC address.
  std::vector<ServingVerifier> ServingVerifiers() const;

 private:
  struct Entry {
    tandem::v1::MemberInfo info;
    absl::Time last_seen;
    // Parsed "verifiers" capability (verifier members).
    std::set<std::string> verifiers;
    // RegisterRequest.previous_member_id.
    std::string previous_member_id;
  };
  bool IsLiveLocked(const std::string& member_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const absl::Duration heartbeat_timeout_;
  const std::string id_prefix_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> members_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> reregistrations_ ABSL_GUARDED_BY(mu_);
  // Member id -> the certificate identity that registered or claimed it
  // (mutual TLS only). Kept when Prune forgets the member, so a pruned id
  // can never be claimed by another identity.
  std::map<std::string, std::string> owners_ ABSL_GUARDED_BY(mu_);
  size_t claims_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

using cluster::MemberStateName;
using cluster::RoleName;

}  // namespace tandem::coordinator
