#pragma once

// gRPC credentials from TlsOptions (gRPC 1.51's TLS API). With mode mtls the
// three files are watched by a FileWatcherCertificateProvider, so a
// certificate rotated on disk is used by new connections within
// TlsOptions::refresh_s, without a restart.
//
//   Server: presents `cert`, requires a client certificate that chains to
//   `ca` (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
//   Client: presents `cert`, requires a server certificate that chains to
//   `ca` and whose DNS or IP SANs cover the dialled host (or
//   TlsOptions::server_name when set).
//
// The providers are shared: every server and channel of a process built from
// the same files uses one provider (one refresh thread). Thread-safe.

#include <grpcpp/grpcpp.h>

#include <memory>

#include "common/rpc/tls_options.h"

namespace tandem::rpc {

// Insecure server credentials when TLS is off.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const TlsOptions& tls);

// Insecure channel credentials when TLS is off. With server_name set, also
// add TargetNameOverride(tls) to the channel's arguments.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const TlsOptions& tls);

// Sets the name checked against the server's certificate when
// tls.server_name is set; no-op otherwise.
void ApplyTargetNameOverride(const TlsOptions& tls,
                             grpc::ChannelArguments* args);

}  // namespace tandem::rpc
