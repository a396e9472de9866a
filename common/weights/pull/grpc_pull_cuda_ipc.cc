// GrpcPullReceiver's CUDA IPC path (grpc_pull_receiver.h, "CUDA IPC
// path"): the offer's checks, the sink's copy and the staging of what it
// copied. Part of the GrpcPullReceiver class.

#include "absl/strings/str_cat.h"
#include "common/weights/cuda_ipc.h"
#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/pull/grpc_pull_receiver_internal.h"

namespace tandem::weights {

using pull_internal::CancelledStatus;

bool GrpcPullReceiver::PreferCudaIpc() const {
  absl::MutexLock lock(&mu_);
  return ipc_preferred_;
}

absl::Status GrpcPullReceiver::CopyCudaIpcOffer(
    const v1::CudaIpcOffer& offer, const v1::WeightManifest& manifest) {
  absl::StatusOr<int> device =
      ValidateCudaIpcOffer(offer, manifest, options_.cuda_ipc->local());
  if (!device.ok()) return device.status();
  return options_.cuda_ipc->CopyOffer(offer, *device);
}

absl::Status GrpcPullReceiver::StageCudaIpcCopy(
    StagingWeights* staging, const v1::WeightManifest& manifest,
    uint32_t* bucket, uint64_t* offset) {
  const auto num_buckets = static_cast<uint32_t>(manifest.buckets_size());
  while (*bucket < num_buckets) {
    if (cancelled()) return CancelledStatus();
    const v1::BucketSpec& b = manifest.buckets(static_cast<int>(*bucket));
    absl::StatusOr<absl::Span<uint8_t>> dst = staging->MutableBucket(*bucket);
    if (!dst.ok()) return dst.status();
    if (dst->size() != b.byte_size() || *offset > b.byte_size()) {
      return absl::DataLossError(
          absl::StrCat("weights v", manifest.policy_version(), " bucket ",
                       *bucket, ": staging holds ", dst->size(),
                       " bytes, the manifest ", b.byte_size()));
    }
    const absl::Span<uint8_t> rest = dst->subspan(*offset);
    if (absl::Status s =
            options_.cuda_ipc->ReadStaged(b.byte_offset() + *offset, rest);
        !s.ok()) {
      return s;
    }
    {
      absl::MutexLock lock(&mu_);
      stats_.bytes += rest.size();
      stats_.cuda_ipc_bytes += rest.size();
    }
    // A bad bucket means the server's device copy is bad: DataLoss rejects
    // the version, as on the socket paths.
    if (absl::Status s = staging->FinishBucket(*bucket); !s.ok()) return s;
    ++*bucket;
    *offset = 0;
  }
  return absl::OkStatus();
}

}  // namespace tandem::weights
