#pragma once

// ManifestDigestSource: the SHA-256 a broadcast version must have, taken
// from the trainer's manifest over gRPC (GetManifest, under the same mTLS
// and role check as FetchWeights) instead of the manifest that came in-band
// over the Gloo/NCCL pair sockets, which nothing authenticates. One small
// RPC per broadcast version, on the receiving thread, after the bytes
// arrived (StagingWeights' digest check).
//
// Thread-compatible: one receiving thread calls it.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/weights/staging_weights.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace tandem::weights {

class ManifestDigestSource : public TrustedDigestSource {
 public:
  // `channel` reaches the trainer's weight server; each call waits at most
  // `timeout`.
  ManifestDigestSource(std::shared_ptr<grpc::Channel> channel,
                       absl::Duration timeout);

  // GetManifest(version).sha256: "" when the trainer sends none; the RPC's
  // error (naming the version) otherwise.
  absl::StatusOr<std::string> TrustedSha256(uint64_t version) override;

  // Both digests of GetManifest(version) from one call: the SHA-256 and
  // the tree root (tree_digest.h), each "" when the trainer sends none.
  struct Digests {
    std::string sha256;
    std::string tree_sha256;
  };
  absl::StatusOr<Digests> TrustedDigests(uint64_t version);

 private:
  std::unique_ptr<v1::WeightServer::Stub> stub_;
  const absl::Duration timeout_;
};

}  // namespace tandem::weights
