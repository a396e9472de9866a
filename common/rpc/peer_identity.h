#pragma once

// PeerIdentity: who is calling, read from the client certificate that mutual
// TLS verified. `tandemctl certs init` writes one SAN URI per certificate,
//
//   spiffe://<trust-domain>/<role>/<name>      e.g. spiffe://tandem/rollout/dev
//
// and that is the only form accepted here: a SPIFFE ID whose path has
// exactly two segments, the first one of the five roles below. The trust
// domain is not checked (the CA that signed the certificate is the trust
// anchor; it is kept for logs). A certificate with no such URI, with a URI
// naming an unknown role, or with two tandem URIs of different roles has no
// identity: the caller is UNAUTHENTICATED. Other URI, DNS and IP SANs are
// ignored.
//
// Authorization tables (which role may call which RPC) belong to each
// service; this file only names the roles and reads the certificate.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::rpc {

enum class PeerRole : uint8_t {
  kCoordinator = 0,
  kTrainer = 1,
  kRollout = 2,
  kVerifier = 3,
  kAdmin = 4,
};

// "coordinator", "trainer", "rollout", "verifier", "admin": the path segment
// of the SPIFFE ID and the name used in error messages and docs.
const char* PeerRoleName(PeerRole role);

// A set of roles (a bit per role), for authorization tables.
class PeerRoleSet {
 public:
  constexpr PeerRoleSet() = default;
  constexpr PeerRoleSet(std::initializer_list<PeerRole> roles) {
    for (PeerRole role : roles) bits_ |= Bit(role);
  }
  static constexpr PeerRoleSet All() {
    return {PeerRole::kCoordinator, PeerRole::kTrainer, PeerRole::kRollout,
            PeerRole::kVerifier, PeerRole::kAdmin};
  }
  constexpr bool Contains(PeerRole role) const {
    return (bits_ & Bit(role)) != 0;
  }
  constexpr bool empty() const { return bits_ == 0; }
  // "trainer", "trainer or rollout", "trainer, rollout or admin".
  std::string ToString() const;

 private:
  static constexpr uint8_t Bit(PeerRole role) {
    return static_cast<uint8_t>(1u << static_cast<unsigned>(role));
  }
  uint8_t bits_ = 0;
};

struct PeerIdentity {
  PeerRole role = PeerRole::kAdmin;
  std::string name;          // <name>, the last path segment
  std::string trust_domain;  // the URI's host
  std::string uri;           // the whole SPIFFE ID, as in the certificate

  // "rollout 'dev' (spiffe://tandem/rollout/dev)", for messages and logs.
  std::string Describe() const;
};

// Parses one SPIFFE ID of the form above. InvalidArgument naming the URI
// and what is wrong with it.
absl::StatusOr<PeerIdentity> ParseSpiffeId(absl::string_view uri);

// The identity among a certificate's SAN values (URI SANs, possibly mixed
// with DNS names and IP addresses): values not starting with "spiffe://"
// are skipped. Unauthenticated when none parses, or when the tandem SPIFFE
// IDs found disagree.
absl::StatusOr<PeerIdentity> IdentityFromSans(
    const std::vector<std::string>& sans);

// The identity of the peer of a server call: its verified client
// certificate's URI SANs (the auth context's "peer_uri" and
// "x509_subject_alternative_name" properties). Unauthenticated when the
// call has no authenticated peer (plaintext, or TLS without a client
// certificate) or the certificate names no identity.
absl::StatusOr<PeerIdentity> PeerIdentityOf(
    const grpc::ServerContextBase& context);

// OK when `caller` has one of `allowed`; else PermissionDenied
// "<rpc> needs the <allowed> role; the caller is <caller.Describe()>".
absl::Status CheckPeerRole(absl::string_view rpc, PeerRoleSet allowed,
                           const PeerIdentity& caller);

// The identity of the caller of `context` when it has one of `allowed`:
// Unauthenticated "<rpc>: ..." when it has no identity (PeerIdentityOf),
// PermissionDenied from CheckPeerRole otherwise. Parses the certificate
// once, for services that need both the check and who asked.
absl::StatusOr<PeerIdentity> AuthorizedPeerOf(
    const grpc::ServerContextBase& context, absl::string_view rpc,
    PeerRoleSet allowed);

// For services whose RPCs each need one set of roles (a daemon's admin
// RPCs): with `tls_enabled`, OK when the caller of `context` has one of
// `allowed`, Unauthenticated when it has no identity (PeerIdentityOf), and
// PermissionDenied from CheckPeerRole otherwise. OK when TLS is off.
absl::Status AuthorizePeer(const grpc::ServerContextBase& context,
                           bool tls_enabled, absl::string_view rpc,
                           PeerRoleSet allowed);

// The `reason` label of a refusal AuthorizePeer returned, for the daemons'
// tandem_<daemon>_auth_refused_total{reason}: "unauthenticated" for
// Unauthenticated, "wrong_role" otherwise.
const char* AuthRefusalReason(const absl::Status& refused);

}  // namespace tandem::rpc
