#include "common/rpc/peer_identity.h"

#include <grpc/grpc_security_constants.h>

#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"

namespace tandem::rpc {
namespace {

constexpr absl::string_view kSpiffeScheme = "spiffe://";
constexpr PeerRole kAllRoles[] = {PeerRole::kCoordinator, PeerRole::kTrainer,
                                  PeerRole::kRollout, PeerRole::kVerifier,
                                  PeerRole::kAdmin};

// Characters allowed in a trust domain and a path segment: what SPIFFE
// allows (letters, digits, '.', '-', '_'), so a name never carries '%',
// '/', '?', '#' or anything a log line could be fooled by.
bool IsSpiffeSegment(absl::string_view s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

const char* PeerRoleName(PeerRole role) {
  switch (role) {
    case PeerRole::kCoordinator:
      return "coordinator";
    case PeerRole::kTrainer:
      return "trainer";
    case PeerRole::kRollout:
      return "rollout";
    case PeerRole::kVerifier:
      return "verifier";
    case PeerRole::kAdmin:
      return "admin";
  }
  return "?";
}

std::string PeerRoleSet::ToString() const {
  std::vector<std::string> names;
  for (PeerRole role : kAllRoles) {
    if (Contains(role)) names.push_back(PeerRoleName(role));
  }
  if (names.empty()) return "no";
  if (names.size() == 1) return names[0];
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

std::string PeerIdentity::Describe() const {
  return absl::StrCat(PeerRoleName(role), " '", name, "' (", uri, ")");
}

absl::StatusOr<PeerIdentity> ParseSpiffeId(absl::string_view uri) {
  auto invalid = [uri](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("SAN URI '", uri,
                     "' is not spiffe://<trust-domain>/<role>/<name>: ", why));
  };
  if (!absl::StartsWith(uri, kSpiffeScheme)) return invalid("not spiffe://");
  const absl::string_view rest = uri.substr(kSpiffeScheme.size());
  const std::vector<absl::string_view> parts = absl::StrSplit(rest, '/');
  if (parts.size() != 3) {
    return invalid(absl::StrCat("the path must have 2 segments, it has ",
                                parts.size() - 1));
  }
  for (absl::string_view part : parts) {
    if (!IsSpiffeSegment(part)) {
      return invalid(absl::StrCat("bad segment '", part,
                                  "' (letters, digits, '.', '-', '_')"));
    }
  }
  PeerIdentity identity;
  bool known = false;
  for (PeerRole role : kAllRoles) {
    if (parts[1] == PeerRoleName(role)) {
      identity.role = role;
      known = true;
    }
  }
  if (!known) {
    return invalid(
        absl::StrCat("unknown role '", parts[1],
                     "' (coordinator, trainer, rollout, verifier, admin)"));
  }
  identity.trust_domain = std::string(parts[0]);
  identity.name = std::string(parts[2]);
  identity.uri = std::string(uri);
  return identity;
}

namespace {

// IdentityFromSans over views, so that PeerIdentityOf reads the auth
// context's values without copying them. A SPIFFE ID equal to one already
// found is not parsed again: the verified peer's URI comes twice, as
// "peer_uri" and among the SANs, on every call.
absl::StatusOr<PeerIdentity> IdentityFromSanViews(
    absl::Span<const absl::string_view> sans) {
  absl::InlinedVector<PeerIdentity, 2> found;
  std::string last_error;
  for (absl::string_view san : sans) {
    if (!absl::StartsWith(san, kSpiffeScheme)) continue;
    bool same = false;
    for (const PeerIdentity& seen : found) same |= seen.uri == san;
    if (same) continue;
    absl::StatusOr<PeerIdentity> identity = ParseSpiffeId(san);
    if (!identity.ok()) {
      last_error = std::string(identity.status().message());
      continue;
    }
    found.push_back(*std::move(identity));
  }
  if (found.empty()) {
    return absl::UnauthenticatedError(
        last_error.empty()
            ? "the client certificate has no SAN URI "
              "spiffe://<trust-domain>/<role>/<name> (issue one with "
              "tandemctl certs init)"
            : absl::StrCat("the client certificate names no identity: ",
                           last_error));
  }
  if (found.size() > 1) {
    std::vector<std::string> uris;
    for (const PeerIdentity& identity : found) uris.push_back(identity.uri);
    return absl::UnauthenticatedError(absl::StrCat(
        "the client certificate names ", found.size(), " identities (",
        absl::StrJoin(uris, ", "), "); a certificate must name one"));
  }
  return std::move(found.front());
}

}  // namespace

absl::StatusOr<PeerIdentity> IdentityFromSans(
    const std::vector<std::string>& sans) {
  const std::vector<absl::string_view> views(sans.begin(), sans.end());
  return IdentityFromSanViews(views);
}

absl::StatusOr<PeerIdentity> PeerIdentityOf(
    const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) {
    return absl::UnauthenticatedError(
        "the call has no verified client certificate");
  }
  // Views into `auth`'s properties, which outlive this function's use of
  // them: `auth` holds the call's auth context.
  absl::InlinedVector<absl::string_view, 8> sans;
  for (const char* property :
       {GRPC_PEER_URI_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME}) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
      sans.emplace_back(value.data(), value.size());
    }
  }
  return IdentityFromSanViews(sans);
}

absl::Status CheckPeerRole(absl::string_view rpc, PeerRoleSet allowed,
                           const PeerIdentity& caller) {
  if (allowed.Contains(caller.role)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(rpc, " needs the ", allowed.ToString(),
                   " role; the caller is ", caller.Describe()));
}

absl::Status AuthorizePeer(const grpc::ServerContextBase& context,
                           bool tls_enabled, absl::string_view rpc,
                           PeerRoleSet allowed) {
  if (!tls_enabled) return absl::OkStatus();
  return AuthorizedPeerOf(context, rpc, allowed).status();
}

absl::StatusOr<PeerIdentity> AuthorizedPeerOf(
    const grpc::ServerContextBase& context, absl::string_view rpc,
    PeerRoleSet allowed) {
  absl::StatusOr<PeerIdentity> caller = PeerIdentityOf(context);
  if (!caller.ok()) {
    return absl::UnauthenticatedError(
        absl::StrCat(rpc, ": ", caller.status().message()));
  }
  absl::Status role = CheckPeerRole(rpc, allowed, *caller);
  if (!role.ok()) return role;
  return caller;
}

const char* AuthRefusalReason(const absl::Status& refused) {
  return refused.code() == absl::StatusCode::kUnauthenticated
             ? "unauthenticated"
             : "wrong_role";
}

}  // namespace tandem::rpc
