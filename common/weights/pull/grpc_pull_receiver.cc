#include "common/weights/pull/grpc_pull_receiver.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/weights/pull/grpc_pull_receiver_internal.h"
#include "common/weights/shared_weight_segment.h"
#include "common/weights/pull/weight_server.h"
#include "kernels/crc32c.h"

namespace tandem::weights {

namespace pull_internal {

absl::Status CancelledStatus() {
  return absl::CancelledError("pull receiver cancelled");
}

// The request for `manifest`'s payload from (bucket, offset) on: the same
// on both paths, so resume semantics cannot drift apart.
v1::FetchWeightsRequest ResumeRequest(const v1::WeightManifest& manifest,
                                      uint32_t bucket, uint64_t offset,
                                      uint32_t chunk_bytes) {
  v1::FetchWeightsRequest request;
  request.set_policy_version(manifest.policy_version());
  request.set_kind(manifest.kind());
  request.set_base_version(manifest.base_version());
  request.set_start_bucket(bucket);
  request.set_start_offset(offset);
  request.set_chunk_bytes(chunk_bytes);
  return request;
}

bool IsFull(const v1::WeightManifest& m) {
  return m.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL;
}

}  // namespace pull_internal

namespace {

using pull_internal::CancelledStatus;
using pull_internal::IsFull;
using pull_internal::ResumeRequest;

// What a wait for a newer version ended by Interrupt() returns.
absl::Status InterruptedStatus() {
  return absl::CancelledError("wait for a newer weights version interrupted");
}

// A long poll asks the server to answer this long before the caller's
// deadline, so that its answer, not the deadline, ends the call.
constexpr absl::Duration kLongPollDeadlineMargin = absl::Milliseconds(50);

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

// The IPv4 host of a gRPC peer string ("ipv4:127.0.0.1:50051"), or "".
std::string PeerHost(const std::string& peer) {
  constexpr absl::string_view kPrefix = "ipv4:";
  if (peer.rfind(kPrefix.data(), 0) != 0) return "";
  const size_t colon = peer.rfind(':');
  if (colon <= kPrefix.size()) return "";
  return peer.substr(kPrefix.size(), colon - kPrefix.size());
}

}  // namespace

GrpcPullReceiver::GrpcPullReceiver(
    std::shared_ptr<grpc::ChannelInterface> channel, PullOptions options)
    : stub_(v1::WeightServer::NewStub(std::move(channel))), options_(options) {}

absl::Time GrpcPullReceiver::RealDeadline(absl::Time deadline) const {
  if (options_.clock == RealClock() || deadline == absl::InfiniteFuture() ||
      deadline == absl::InfinitePast()) {
    return deadline;
  }
  return absl::Now() + (deadline - options_.clock->Now());
}

bool GrpcPullReceiver::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void GrpcPullReceiver::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (active_ != nullptr) active_->TryCancel();
  if (polling_ != nullptr) polling_->TryCancel();
  if (active_fd_ >= 0) shutdown(active_fd_, SHUT_RDWR);
}

void GrpcPullReceiver::Interrupt() {
  absl::MutexLock lock(&mu_);
  if (transferring_) return;
  interrupted_ = true;
  if (polling_ != nullptr) polling_->TryCancel();
}

PullStats GrpcPullReceiver::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<v1::WeightManifest> GrpcPullReceiver::GetManifest(
    uint64_t version, absl::Time deadline, uint64_t newer_than,
    absl::Duration wait) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(RealDeadline(deadline)));
  v1::GetManifestRequest request;
  request.set_policy_version(version);
  const bool long_poll = version == 0 && wait > absl::ZeroDuration();
  if (long_poll) {
    request.set_newer_than(newer_than);
    request.set_wait_ms(static_cast<uint32_t>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(wait), 1, kMaxLongPollMs)));
    absl::MutexLock lock(&mu_);
    if (cancelled_) return CancelledStatus();
    if (interrupted_) {
      return InterruptedStatus();
    }
    polling_ = &context;
  }
  v1::WeightManifest manifest;
  grpc::Status s = stub_->GetManifest(&context, request, &manifest);
  if (long_poll) {
    absl::MutexLock lock(&mu_);
    polling_ = nullptr;
  }
  if (!s.ok()) {
    return FromGrpc(s, absl::StrCat("GetManifest(v", version, ")"));
  }
  // The raw data path, when the server announces one: its port on the host
  // this call reached.
  uint32_t port = 0;
  const auto& metadata = context.GetServerInitialMetadata();
  const auto it = metadata.find(kDataPortMetadata);
  if (it == metadata.end() ||
      !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                        &port) ||
      port > 65535) {
    port = 0;
  }
  const std::string host = PeerHost(context.peer());
  absl::MutexLock lock(&mu_);
  data_host_ = host;
  data_port_ = host.empty() ? 0 : static_cast<uint16_t>(port);
  return manifest;
}

absl::StatusOr<v1::WeightManifest> GrpcPullReceiver::Plan(
    StagingWeights* staging, absl::Time deadline) {
  const std::optional<uint64_t> live = staging->live_version();
  // A version refused for non-finite values (StagingWeights) is not
  // fetched again: wait for a newer one and take it in full (the deltas
  // after the refused version are on weights this worker does not hold).
  const std::optional<uint64_t> refused = staging->refused_version();
  const bool past_refused =
      refused.has_value() && (!live.has_value() || *refused > *live);
  const uint64_t newer_than = past_refused ? *refused : live.value_or(0);
  for (;;) {
    if (cancelled()) return CancelledStatus();
    // With a live version: a long poll for a newer one, ending a little
    // before the deadline so that the server's answer (not the deadline)
    // ends it; an Interrupt() made before asks at once instead, and ends
    // the wait when nothing is newer. Without one (any version will do,
    // and versions start at 0) the receiver asks at once.
    absl::Duration wait =
        live.has_value() || past_refused
            ? std::min(options_.long_poll, deadline - options_.clock->Now() -
                                               kLongPollDeadlineMargin)
            : absl::ZeroDuration();
    {
      absl::MutexLock lock(&mu_);
      if (interrupted_) wait = absl::ZeroDuration();
    }
    if (wait < absl::Milliseconds(1)) wait = absl::ZeroDuration();
    const absl::Time asked = options_.clock->Now();
    absl::StatusOr<v1::WeightManifest> latest =
        GetManifest(0, deadline, newer_than, wait);
    if (latest.ok() && past_refused && latest->policy_version() > newer_than) {
      if (IsFull(*latest)) return latest;
      // The server keeps the newest version in full too.
      return GetManifest(latest->policy_version(), deadline);
    }
    if (latest.ok() && !past_refused &&
        (!live.has_value() || latest->policy_version() > *live)) {
      // A device-to-device copy of the whole version beats any delta over
      // a socket, while this server's offers work.
      if (IsFull(*latest) && PreferCudaIpc()) return latest;
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
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return CancelledStatus();
      if (interrupted_) {
        interrupted_ = false;
        return InterruptedStatus();
      }
    }
    const bool long_polled = wait > absl::ZeroDuration();
    if (long_polled && absl::IsDeadlineExceeded(latest.status())) {
      return absl::DeadlineExceededError(
          "no newer weights version on the weight server before the "
          "deadline");
    }
    // A long poll cancelled by the server (e.g. shutting down) is asked
    // again, as an unreachable server is.
    if (!latest.ok() && !absl::IsNotFound(latest.status()) &&
        !absl::IsUnavailable(latest.status()) &&
        !(long_polled && absl::IsCancelled(latest.status()))) {
      return latest.status();
    }
    if (options_.clock->Now() + options_.poll_interval > deadline) {
      return absl::DeadlineExceededError(
          "no newer weights version on the weight server before the "
          "deadline");
    }
    // At most one question per poll_interval: an answer that came sooner
    // (a server that does not hold long polls, an error) waits for the
    // rest of it.
    const absl::Duration pause =
        asked + options_.poll_interval - options_.clock->Now();
    if (pause <= absl::ZeroDuration()) continue;
    absl::MutexLock lock(&mu_);
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return cancelled_ || interrupted_;
    };
    options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&woken), pause);
    if (interrupted_ && !cancelled_) {
      interrupted_ = false;
      return InterruptedStatus();
    }
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
  // The wait is over: an interrupt from now on must not cut the transfer.
  {
    absl::MutexLock lock(&mu_);
    transferring_ = true;
    interrupted_ = false;
  }
  absl::Cleanup transferred = [this] {
    absl::MutexLock lock(&mu_);
    transferring_ = false;
  };
  // `deadline` bounds the wait for a newer version; a transfer that has
  // begun gets at least transfer_timeout, so short waiting slices never cut
  // a large payload short (it would start over at the next call).
  // The transfer is real I/O: from here on the deadline is real time.
  deadline = RealDeadline(
      std::max(deadline, options_.clock->Now() + options_.transfer_timeout));
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

absl::Status GrpcPullReceiver::ReadStream(
    StagingWeights* staging, const v1::WeightManifest& manifest,
    absl::Time deadline, uint32_t* bucket, uint64_t* offset,
    std::vector<uint8_t>* delta,
    std::optional<v1::SharedWeightSegment>* segment,
    std::optional<absl::Status>* ipc) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return CancelledStatus();
    active_ = &context;
  }
  v1::FetchWeightsRequest request =
      ResumeRequest(manifest, *bucket, *offset, options_.chunk_bytes);
  request.set_shared_memory(segment != nullptr);
  if (ipc != nullptr) *request.mutable_cuda_ipc() = options_.cuda_ipc->peer();
  std::unique_ptr<grpc::ClientReader<v1::WeightChunk>> reader =
      stub_->FetchWeights(&context, request);
  {
    absl::MutexLock lock(&mu_);
    ++stats_.grpc_streams;
  }
  const bool full = IsFull(manifest);
  const uint32_t num_buckets =
      full ? static_cast<uint32_t>(manifest.buckets_size()) : 1;
  absl::Status result;
  v1::WeightChunk chunk;
  bool ipc_offered = false;
  while (*bucket < num_buckets && reader->Read(&chunk)) {
    if (chunk.has_cuda_ipc()) {
      if (ipc == nullptr ||
          chunk.policy_version() != manifest.policy_version()) {
        result = absl::AbortedError(
            absl::StrCat("weights v", manifest.policy_version(),
                         ": unexpected CUDA IPC offer"));
      } else {
        // Copied while the call (the server's lease) is open.
        *ipc = CopyCudaIpcOffer(chunk.cuda_ipc(), manifest);
        ipc_offer_device_ = chunk.cuda_ipc().device_uuid();
        ipc_offered = true;
      }
      break;
    }
    if (chunk.has_shared_memory()) {
      if (segment == nullptr ||
          chunk.policy_version() != manifest.policy_version()) {
        result = absl::AbortedError(
            absl::StrCat("weights v", manifest.policy_version(),
                         ": unexpected shared-memory segment offer"));
      } else {
        *segment = chunk.shared_memory();
      }
      break;
    }
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
  // An offer's call is ended by the client: the copy is done (or given up).
  if (!result.ok() || ipc_offered) context.TryCancel();
  grpc::Status finished = reader->Finish();
  {
    absl::MutexLock lock(&mu_);
    active_ = nullptr;
  }
  if (!result.ok()) return result;
  if (ipc_offered) return absl::OkStatus();
  if (!finished.ok()) return FromGrpc(finished, "FetchWeights");
  if (segment != nullptr && segment->has_value()) return absl::OkStatus();
  if (*bucket < num_buckets) {
    return absl::UnavailableError("FetchWeights stream ended early");
  }
  return absl::OkStatus();
}

std::optional<v1::WeightManifest> GrpcPullReceiver::TakeCudaIpcHandoff() {
  return std::exchange(handed_off_, std::nullopt);
}

absl::Status GrpcPullReceiver::Fetch(StagingWeights* staging,
                                     const v1::WeightManifest& manifest,
                                     absl::Time deadline) {
  handed_off_.reset();
  if (absl::Status s = staging->Begin(manifest); !s.ok()) return s;
  uint32_t bucket = 0;
  uint64_t offset = 0;
  std::vector<uint8_t> delta;
  int failures = 0;
  bool asked_shm = false, offered_shm = false;
  bool asked_ipc = false, offered_ipc = false;
  for (;;) {
    const uint32_t bucket_before = bucket;
    const uint64_t offset_before = offset;
    bool connected = false;
    absl::Status s;
    std::optional<v1::SharedWeightSegment> segment;
    bool ask_shm = options_.shared_memory && IsFull(manifest);
    if (ask_shm) {
      absl::MutexLock lock(&mu_);
      ask_shm = !shm_off_;
    }
    asked_shm = asked_shm || ask_shm;
    std::optional<v1::SharedWeightSegment>* want = ask_shm ? &segment : nullptr;
    // CUDA IPC: once per version, for the whole payload, over FetchWeights.
    std::optional<absl::Status> ipc;
    const bool ask_ipc = options_.cuda_ipc != nullptr && IsFull(manifest) &&
                         !asked_ipc && bucket == 0 && offset == 0;
    if (ask_ipc) {
      asked_ipc = true;
      connected = true;
      s = ReadStream(staging, manifest, deadline, &bucket, &offset, &delta,
                     want, &ipc);
    } else if (options_.raw_data) {
      s = ReadRawStream(staging, manifest, deadline, &bucket, &offset, &delta,
                        want, &connected);
    }
    if (!connected) {
      s = ReadStream(staging, manifest, deadline, &bucket, &offset, &delta,
                     want);
    }
    if (s.ok() && ipc.has_value()) {
      offered_ipc = true;
      const std::string ipc_device = ipc_offer_device_;
      if (!ipc->ok()) {
        ComponentLogger("weights")->warn(
            "weights v{}: CUDA IPC offer not used ({}); streaming it instead",
            manifest.policy_version(), ipc->ToString());
        absl::MutexLock lock(&mu_);
        ipc_preferred_ = false;
        ++(absl::IsInvalidArgument(*ipc) ? stats_.cuda_ipc_refused
                                         : stats_.cuda_ipc_open_failures);
        continue;
      }
      const bool handoff =
          options_.cuda_ipc_handoff && options_.cuda_ipc->hands_over();
      if (handoff) {
        // The caller verifies the copy where it lies and makes it live;
        // nothing is staged here (grpc_pull_receiver.h, "Handoff mode").
        staging->Abort();
        handed_off_ = manifest;
        absl::MutexLock lock(&mu_);
        stats_.bytes += manifest.total_bytes();
        stats_.cuda_ipc_bytes += manifest.total_bytes();
      } else {
        s = StageCudaIpcCopy(staging, manifest, &bucket, &offset);
      }
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        ipc_preferred_ = true;
        if (++stats_.cuda_ipc_versions == 1) {
          ComponentLogger("weights")->info(
              "weights v{}: received by CUDA IPC from device {} ({} bytes "
              "copied device-to-device); later versions are counted as "
              "transport cuda_ipc",
              manifest.policy_version(), ipc_device, manifest.total_bytes());
        }
      }
    }
    if (s.ok() && segment.has_value()) {
      offered_shm = true;
      bool opened = false;
      s = CopySharedSegment(staging, manifest, *segment, deadline, &bucket,
                            &offset, &opened);
      if (!opened) {
        // Not on this host (or not the segment offered): the socket, at
        // once, for this and every later version.
        ComponentLogger("weights")->debug(
            "weights v{}: shared-memory segment unusable here ({}); pulling "
            "over the socket from now on",
            manifest.policy_version(), s.ToString());
        absl::MutexLock lock(&mu_);
        shm_off_ = true;
        ++(absl::IsFailedPrecondition(s) ? stats_.shm_mismatches
                                         : stats_.shm_open_failures);
        continue;
      }
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        ++stats_.shm_versions;
      }
    }
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
  if (asked_shm && !offered_shm) ++stats_.shm_not_offered;
  if (asked_ipc && !offered_ipc) {
    ++stats_.cuda_ipc_not_offered;
    ipc_preferred_ = false;
  }
  return absl::OkStatus();
}

}  // namespace tandem::weights
