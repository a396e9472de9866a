#include "services/coordinator/member_registry.h"

#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::coordinator {

std::string NewIncarnationTag() {
  const uint32_t nonce = std::random_device{}();
  return absl::StrCat(absl::Hex(nonce, absl::kZeroPad8));
}

MemberRegistry::MemberRegistry(absl::Duration heartbeat_timeout,
                               std::string incarnation)
    : heartbeat_timeout_(heartbeat_timeout),
      id_prefix_(incarnation.empty() ? "" : incarnation + "-") {}

tandem::v1::MemberInfo MemberRegistry::Register(
    const tandem::v1::RegisterRequest& request, absl::Time now,
    const std::string& owner) {
  absl::MutexLock lock(&mu_);
  Entry entry;
  tandem::v1::MemberInfo& info = entry.info;
  info.set_member_id(
      absl::StrCat(RoleName(request.role()), "-", id_prefix_, next_id_++));
  info.set_role(request.role());
  info.set_state(tandem::v1::MEMBER_STATE_ALIVE);
  info.set_grpc_address(request.grpc_address());
  info.set_metrics_address(request.metrics_address());
  info.set_hostname(request.hostname());
  info.set_pid(request.pid());
  info.set_policy_version(request.policy_version());
  info.set_registered_unix_ms(absl::ToUnixMillis(now));
  info.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
  if (!request.previous_member_id().empty()) {
    int count = ++reregistrations_[request.previous_member_id()];
    info.set_reregistrations(count);
    reregistrations_[info.member_id()] = count;
  }
  if (auto it = request.capabilities().find("verifiers");
      it != request.capabilities().end()) {
    for (absl::string_view name : absl::StrSplit(it->second, ',')) {
      name = absl::StripAsciiWhitespace(name);
      if (!name.empty()) entry.verifiers.emplace(name);
    }
  }
  entry.previous_member_id = request.previous_member_id();
  if (!owner.empty()) {
    owners_[info.member_id()] = owner;
    if (!entry.previous_member_id.empty()) {
      auto previous = owners_.find(entry.previous_member_id);
      if (previous == owners_.end()) {
        owners_[entry.previous_member_id] = owner;
      } else if (previous->second != owner) {
        entry.previous_member_id.clear();
      }
    }
  }
  entry.last_seen = now;
  members_[info.member_id()] = entry;
  return info;
}

absl::Status MemberRegistry::Heartbeat(
    const tandem::v1::HeartbeatRequest& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(request.member_id());
  if (it == members_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("member '", request.member_id(),
                     "' is not registered; register again"));
  }
  tandem::v1::MemberInfo& info = it->second.info;
  if (info.state() == tandem::v1::MEMBER_STATE_DEAD ||
      info.state() == tandem::v1::MEMBER_STATE_LEFT) {
    return absl::FailedPreconditionError(
        absl::StrCat("member '", request.member_id(), "' was declared ",
                     MemberStateName(info.state()), "; register again"));
  }
  it->second.last_seen = now;
  info.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
  info.set_policy_version(request.policy_version());
  if (request.state() == tandem::v1::MEMBER_STATE_DRAINING) {
    info.set_state(tandem::v1::MEMBER_STATE_DRAINING);
  }
  *info.mutable_load() = request.load();
  return absl::OkStatus();
}

absl::Status MemberRegistry::CheckOwner(const std::string& member_id,
                                        const std::string& owner) {
  if (owner.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(member_id);
  if (it != owners_.end()) {
    if (it->second == owner) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("member '", member_id, "' belongs to ", it->second,
                     ", not to the caller's identity ", owner));
  }
  if (claims_ >= kMaxClaims) {
    return absl::PermissionDeniedError(absl::StrCat(
        "member '", member_id,
        "' was not registered with this coordinator "
        "and ",
        kMaxClaims, " such ids are claimed already; register again"));
  }
  ++claims_;
  owners_[member_id] = owner;
  return absl::OkStatus();
}

absl::Status MemberRegistry::Deregister(const std::string& member_id) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(member_id);
  if (it == members_.end()) {
    return absl::NotFoundError(
        absl::StrCat("member '", member_id, "' is not registered"));
  }
  it->second.info.set_state(tandem::v1::MEMBER_STATE_LEFT);
  return absl::OkStatus();
}

std::vector<tandem::v1::MemberInfo> MemberRegistry::ExpireSilent(
    absl::Time now) {
  std::vector<tandem::v1::MemberInfo> expired;
  absl::MutexLock lock(&mu_);
  for (auto& [id, entry] : members_) {
    const auto state = entry.info.state();
    if (state != tandem::v1::MEMBER_STATE_ALIVE &&
        state != tandem::v1::MEMBER_STATE_DRAINING) {
      continue;
    }
    if (now - entry.last_seen > heartbeat_timeout_) {
      entry.info.set_state(tandem::v1::MEMBER_STATE_DEAD);
      expired.push_back(entry.info);
    }
  }
  return expired;
}

std::vector<tandem::v1::MemberInfo> MemberRegistry::Snapshot() const {
  std::vector<tandem::v1::MemberInfo> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, entry] : members_) out.push_back(entry.info);
  return out;
}

void MemberRegistry::Prune(absl::Time now, absl::Duration retention) {
  absl::MutexLock lock(&mu_);
  for (auto it = members_.begin(); it != members_.end();) {
    const auto state = it->second.info.state();
    const bool gone = state == tandem::v1::MEMBER_STATE_DEAD ||
                      state == tandem::v1::MEMBER_STATE_LEFT;
    if (gone && now - it->second.last_seen > retention) {
      it = members_.erase(it);
    } else {
      ++it;
    }
  }
}

bool MemberRegistry::IsLive(const std::string& member_id) const {
  absl::MutexLock lock(&mu_);
  return IsLiveLocked(member_id);
}

std::vector<std::string> MemberRegistry::LeaseHolders(
    const std::string& member_id) const {
  std::vector<std::string> holders = {member_id};
  absl::MutexLock lock(&mu_);
  auto it = members_.find(member_id);
  if (it == members_.end()) return holders;
  const std::string& previous = it->second.previous_member_id;
  if (!previous.empty() && previous != member_id && !IsLiveLocked(previous)) {
    holders.push_back(previous);
  }
  return holders;
}

bool MemberRegistry::IsLiveLocked(const std::string& member_id) const {
  auto it = members_.find(member_id);
  if (it == members_.end()) return false;
  const auto state = it->second.info.state();
  return state == tandem::v1::MEMBER_STATE_ALIVE ||
         state == tandem::v1::MEMBER_STATE_DRAINING;
}

std::vector<std::string> MemberRegistry::LiveAddresses(
    tandem::v1::Role role) const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, entry] : members_) {
    if (entry.info.role() == role &&
        entry.info.state() == tandem::v1::MEMBER_STATE_ALIVE &&
        !entry.info.grpc_address().empty()) {
      out.push_back(entry.info.grpc_address());
    }
  }
  return out;
}

std::vector<MemberRegistry::ServingVerifier> MemberRegistry::ServingVerifiers()
    const {
  std::vector<ServingVerifier> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, entry] : members_) {
    if (entry.info.role() == tandem::v1::ROLE_VERIFIER &&
        entry.info.state() == tandem::v1::MEMBER_STATE_ALIVE &&
        !entry.info.grpc_address().empty()) {
      out.push_back({entry.info.grpc_address(), entry.verifiers});
    }
  }
  return out;
}

std::map<tandem::v1::Role, int> MemberRegistry::CountAlive() const {
  std::map<tandem::v1::Role, int> counts;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, entry] : members_) {
    const auto state = entry.info.state();
    if (state == tandem::v1::MEMBER_STATE_ALIVE ||
        state == tandem::v1::MEMBER_STATE_DRAINING) {
      ++counts[entry.info.role()];
    }
  }
  return counts;
}

tandem::v1::Role MemberRegistry::RoleOf(const std::string& member_id) const {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(member_id);
  return it == members_.end() ? tandem::v1::ROLE_UNSPECIFIED
                              : it->second.info.role();
}

}  // namespace tandem::coordinator
