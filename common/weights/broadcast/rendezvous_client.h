#pragma once

// RendezvousClient: the rendezvous keyspace (rendezvous_keys.h) of the
// trainer's gRPC Rendezvous service (proto/tandem/v1/rendezvous.proto), for
// the members of a broadcast group that are not the trainer. Each
// operation is one unary RPC with a deadline of `rpc_timeout`; Wait is a
// series of bounded long polls until its own `wait` is over. Errors keep
// the server's code (PermissionDenied for a certificate of the wrong role,
// Unavailable when the TLS handshake or the connection fails) and name
// the operation, the key and the trainer's address.
//
// Thread-safe (gRPC stubs are).

#include <grpcpp/channel.h>

#include <memory>
#include <string>
#include <vector>

#include "common/weights/broadcast/rendezvous_keys.h"
#include "tandem/v1/rendezvous.grpc.pb.h"

namespace tandem::weights {

class RendezvousClient : public RendezvousKeyspace {
 public:
  // `target` names the trainer in errors.
  RendezvousClient(std::shared_ptr<grpc::Channel> channel, std::string target,
                   absl::Duration rpc_timeout = absl::Seconds(10));

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
  absl::Status Failed(const char* op, const std::string& key,
                      const grpc::Status& status) const;
  void SetDeadline(grpc::ClientContext* context, absl::Duration extra) const;
  // One unary call of `method` with the client's deadline plus `extra`;
  // a failure names `op` and `key`.
  template <typename Request, typename Response>
  absl::Status Call(const char* op, const std::string& key,
                    grpc::Status (tandem::v1::Rendezvous::Stub::*method)(
                        grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response,
                    absl::Duration extra = absl::ZeroDuration()) const;

  const std::unique_ptr<tandem::v1::Rendezvous::Stub> stub_;
  const std::string target_;
  const absl::Duration rpc_timeout_;
};

}  // namespace tandem::weights
