#include "common/weights/pull/manifest_digest_source.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::weights {

ManifestDigestSource::ManifestDigestSource(
    std::shared_ptr<grpc::Channel> channel, absl::Duration timeout)
    : stub_(v1::WeightServer::NewStub(std::move(channel))), timeout_(timeout) {}

absl::StatusOr<std::string> ManifestDigestSource::TrustedSha256(
    uint64_t version) {
  absl::StatusOr<Digests> digests = TrustedDigests(version);
  if (!digests.ok()) return digests.status();
  return std::move(digests->sha256);
}

absl::StatusOr<ManifestDigestSource::Digests>
ManifestDigestSource::TrustedDigests(uint64_t version) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  v1::GetManifestRequest request;
  request.set_policy_version(version);
  v1::WeightManifest manifest;
  const grpc::Status s = stub_->GetManifest(&context, request, &manifest);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("GetManifest(v", version,
                                     ") for its digest: ", s.error_message()));
  }
  if (manifest.policy_version() != version) {
    return absl::DataLossError(
        absl::StrCat("GetManifest(v", version, ") answered v",
                     manifest.policy_version()));
  }
  return Digests{.sha256 = std::move(*manifest.mutable_sha256()),
                 .tree_sha256 = std::move(*manifest.mutable_tree_sha256())};
}

}  // namespace tandem::weights
