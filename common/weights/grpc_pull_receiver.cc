#include "common/weights/grpc_pull_receiver.h"

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/crc32c.h"

namespace tandem::weights {
namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

bool IsFull(const v1::WeightManifest& m) {
  return m.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL;
}

}  // namespace

GrpcPullReceiver::GrpcPullReceiver(
    std::shared_ptr<grpc::ChannelInterface> channel, PullOptions options)
    : stub_(v1::WeightServer::NewStub(std::move(channel))), options_(options) {}

bool GrpcPullReceiver::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void GrpcPullReceiver::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (active_ != nullptr) active_->TryCancel();
}

PullStats GrpcPullReceiver::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<v1::WeightManifest> GrpcPullReceiver::GetManifest(
    uint64_t version, absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::GetManifestRequest request;
  request.set_policy_version(version);
  v1::WeightManifest manifest;
  grpc::Status s = stub_->GetManifest(&context, request, &manifest);
  if (!s.ok()) {
    return FromGrpc(s, absl::StrCat("GetManifest(v", version, ")"));
  }
  return manifest;
}

absl::StatusOr<v1::WeightManifest> GrpcPullReceiver::Plan(
    StagingWeights* staging, absl::Time deadline) {
  const std::optional<uint64_t> live = staging->live_version();
  for (;;) {
    if (cancelled()) return absl::CancelledError("pull receiver cancelled");
    absl::StatusOr<v1::WeightManifest> latest = GetManifest(0, deadline);
    if (latest.ok() &&
        (!live.has_value() || latest->policy_version() > *live)) {
      // Follow deltas from live while live is at or past the latest anchor,
      // or just before it (the anchor may have a delta on live too).
      if (live.has_value() && *live + 1 >= latest->anchor_version()) {
        if (latest->policy_version() == *live + 1 && !IsFull(*latest)) {
          return latest;
        }
        absl::StatusOr<v1::WeightManifest> next =
            GetManifest(*live + 1, deadline);
        if (next.ok() && (IsFull(*next) || next->base_version() == *live)) {
          // The server shows the FULL manifest when it holds one; prefer
          // the (much smaller) delta when it is also retained, also for an
          // anchor (the publisher may store both).
          if (IsFull(*next)) {
            v1::WeightManifest as_delta = *next;
            as_delta.set_kind(v1::WEIGHT_PAYLOAD_KIND_DELTA);
            as_delta.set_base_version(*live);
            return as_delta;  // Fetch falls back to FULL if absent.
          }
          return next;
        }
      }
      if (IsFull(*latest)) return latest;
      return GetManifest(latest->anchor_version(), deadline);
    }
    if (!latest.ok() && !absl::IsNotFound(latest.status()) &&
        !absl::IsUnavailable(latest.status())) {
      return latest.status();
    }
    if (absl::Now() + options_.poll_interval > deadline) {
      return absl::DeadlineExceededError(
          "no newer weights version on the weight server before the "
          "deadline");
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&cancelled_), options_.poll_interval);
  }
}

absl::StatusOr<uint64_t> GrpcPullReceiver::ReceiveNext(StagingWeights* staging,
                                                       absl::Time deadline) {
  if (staging->ready()) {
    return absl::FailedPreconditionError(
        "a received weights version is staged but not committed");
  }
  absl::StatusOr<v1::WeightManifest> manifest = Plan(staging, deadline);
  if (!manifest.ok()) return manifest.status();
  absl::Status fetched = Fetch(staging, *manifest, deadline);
  if (!fetched.ok() && !IsFull(*manifest) && absl::IsNotFound(fetched)) {
    // The delta was not retained after all: fall back to the full copy.
    manifest->set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
    manifest->set_base_version(0);
    fetched = Fetch(staging, *manifest, deadline);
  }
  if (!fetched.ok()) return fetched;
  return manifest->policy_version();
}

absl::Status GrpcPullReceiver::ReadStream(StagingWeights* staging,
                                          const v1::WeightManifest& manifest,
                                          absl::Time deadline, uint32_t* bucket,
                                          uint64_t* offset,
                                          std::vector<uint8_t>* delta) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError("pull receiver cancelled");
    active_ = &context;
  }
  v1::FetchWeightsRequest request;
  request.set_policy_version(manifest.policy_version());
  request.set_kind(manifest.kind());
  request.set_base_version(manifest.base_version());
  request.set_start_bucket(*bucket);
  request.set_start_offset(*offset);
  request.set_chunk_bytes(options_.chunk_bytes);
  std::unique_ptr<grpc::ClientReader<v1::WeightChunk>> reader =
      stub_->FetchWeights(&context, request);
  const bool full = IsFull(manifest);
  const uint32_t num_buckets =
      full ? static_cast<uint32_t>(manifest.buckets_size()) : 1;
  absl::Status result;
  v1::WeightChunk chunk;
  while (*bucket < num_buckets && reader->Read(&chunk)) {
    const std::string& data = chunk.data();
    if (chunk.policy_version() != manifest.policy_version() ||
        chunk.bucket() != *bucket || chunk.offset() != *offset) {
      // Aborted (not DataLoss): the stream is retried from the resume point.
      result = absl::AbortedError(absl::StrCat(
          "weights v", manifest.policy_version(), ": chunk at (bucket ",
          chunk.bucket(), ", offset ", chunk.offset(), "), expected (", *bucket,
          ", ", *offset, ")"));
      break;
    }
    if (kernels::Crc32c(data.data(), data.size()) != chunk.crc32c()) {
      absl::MutexLock lock(&mu_);
      ++stats_.chunk_crc_errors;
      result = absl::AbortedError(absl::StrCat(
          "weights v", manifest.policy_version(), " bucket ", *bucket,
          " offset ", *offset, ": chunk crc32c mismatch"));
      break;
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
    if (full) {
      if (absl::Status s =
              staging->WriteBucketChunk(*bucket, *offset, {bytes, data.size()});
          !s.ok()) {
        result = s;
        break;
      }
    } else {
      delta->insert(delta->end(), bytes, bytes + data.size());
    }
    *offset += data.size();
    {
      absl::MutexLock lock(&mu_);
      stats_.bytes += data.size();
    }
    if (chunk.bucket_complete()) {
      if (full) {
        // A bad bucket means the server's copy is bad: not retryable.
        if (absl::Status s = staging->FinishBucket(*bucket); !s.ok()) {
          context.TryCancel();
          reader->Finish();
          absl::MutexLock lock(&mu_);
          active_ = nullptr;
          return s;
        }
      }
      ++*bucket;
      *offset = 0;
    }
  }
  if (!result.ok()) context.TryCancel();
  grpc::Status finished = reader->Finish();
  {
    absl::MutexLock lock(&mu_);
    active_ = nullptr;
  }
  if (!result.ok()) return result;
  if (!finished.ok()) return FromGrpc(finished, "FetchWeights");
  if (*bucket < num_buckets) {
    return absl::UnavailableError("FetchWeights stream ended early");
  }
  return absl::OkStatus();
}

absl::Status GrpcPullReceiver::Fetch(StagingWeights* staging,
                                     const v1::WeightManifest& manifest,
                                     absl::Time deadline) {
  if (absl::Status s = staging->Begin(manifest); !s.ok()) return s;
  uint32_t bucket = 0;
  uint64_t offset = 0;
  std::vector<uint8_t> delta;
  int failures = 0;
  for (;;) {
    const uint32_t bucket_before = bucket;
    const uint64_t offset_before = offset;
    absl::Status s =
        ReadStream(staging, manifest, deadline, &bucket, &offset, &delta);
    if (s.ok()) break;
    // Transport trouble and bad chunks are retried; a bucket that failed
    // verification (DataLoss) already rejected the version.
    const bool retryable = absl::IsUnavailable(s) || absl::IsAborted(s) ||
                           absl::IsResourceExhausted(s);
    if (!retryable || cancelled() || absl::Now() >= deadline ||
        staging->ready()) {
      staging->Abort();
      return s;
    }
    const bool progressed = bucket != bucket_before || offset != offset_before;
    failures = progressed ? 1 : failures + 1;
    if (failures >= options_.max_attempts) {
      staging->Abort();
      return absl::UnavailableError(absl::StrCat(
          "weights v", manifest.policy_version(), ": giving up after ",
          failures, " failed attempts: ", s.message()));
    }
    absl::MutexLock lock(&mu_);
    ++stats_.resumes;
  }
  if (!IsFull(manifest)) {
    if (absl::Status s = staging->ApplyDelta(delta); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  ++stats_.versions;
  return absl::OkStatus();
}

}  // namespace tandem::weights
