#include "common/weights/pull/weight_server.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"
#include "common/rpc/peer_identity.h"
#include "common/weights/pull/weight_server_internal.h"
#include "kernels/crc32c.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"

namespace tandem::weights {
namespace {

v1::SharedWeightSegment SegmentMessage(const SharedWeightSegment& segment) {
  v1::SharedWeightSegment m;
  m.set_name(segment.name());
  m.set_size(segment.size());
  m.set_token(segment.token());
  return m;
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace

absl::Status WeightServerService::Authorize(
    const grpc::CallbackServerContext& context, const char* rpc) const {
  absl::Status status = rpc::AuthorizePeer(context, options_.tls_enabled, rpc,
                                           kWeightReaderRoles);
  if (status.ok()) return status;
  const char* reason = rpc::AuthRefusalReason(status);
  if (options_.auth_refused != nullptr) {
    options_.auth_refused->Add({{"reason", reason}}).Increment();
  }
  ComponentLogger("weights")->warn("refused {} from {} ({}): {}", rpc,
                                   context.peer(), reason,
                                   std::string(status.message()));
  return status;
}

absl::Status WeightServerService::InjectedFailure(const Stream& stream) const {
  const int fail_after = fail_after_.load();
  if (!stream.done() && fail_after >= 0 && stream.sent >= fail_after) {
    return absl::UnavailableError("injected stream failure");
  }
  return absl::OkStatus();
}

bool WeightServerService::Advance(Stream& stream, NextChunk* chunk) {
  const v1::WeightManifest& m = stream.payload.manifest;
  const bool full = stream.full();
  const uint32_t num_buckets =
      full ? static_cast<uint32_t>(m.buckets_size()) : 1;
  if (stream.bucket >= num_buckets) return false;
  const uint64_t bucket_offset =
      full ? m.buckets(static_cast<int>(stream.bucket)).byte_offset() : 0;
  const uint64_t bucket_size =
      full ? m.buckets(static_cast<int>(stream.bucket)).byte_size()
           : stream.payload.bytes->size();
  const uint64_t n =
      std::min<uint64_t>(stream.chunk_bytes, bucket_size - stream.offset);
  chunk->bucket = stream.bucket;
  chunk->offset = stream.offset;
  chunk->data = stream.payload.bytes->data() + bucket_offset + stream.offset;
  chunk->size = n;
  // On the raw path a chunk that is a whole bucket of a FULL payload
  // carries the manifest's bucket CRC (the receiver verifies the bucket
  // against it, once); other chunks are checksummed here. (A gRPC client
  // checks every chunk's CRC and retries a mismatch: it must describe the
  // bytes sent, so that a bad stored copy is reported as a bad bucket.)
  chunk->crc32c = stream.raw && full && stream.offset == 0 && n == bucket_size
                      ? m.buckets(static_cast<int>(stream.bucket)).crc32c()
                      : kernels::Crc32c(chunk->data, n);
  chunk->bucket_complete = stream.offset + n == bucket_size;
  const uint64_t index = chunks_.fetch_add(1);
  chunk->corrupt = static_cast<int64_t>(index) == corrupt_at_.load() && n > 0;
  bytes_ += n;
  if (options_.metrics != nullptr) {
    options_.metrics->RecordBytes(SyncDirection::kSent, SyncTransport::kPull,
                                  full, static_cast<double>(n));
  }
  ++stream.sent;
  stream.offset += n;
  if (stream.offset == bucket_size) {
    ++stream.bucket;
    stream.offset = 0;
  }
  return true;
}

class WeightServerService::FetchReactor
    : public grpc::ServerWriteReactor<v1::WeightChunk> {
 public:
  FetchReactor(WeightServerService* service, Stream stream)
      : service_(service), stream_(std::move(stream)) {
    if (stream_.device != nullptr) {
      bool shut_down;
      {
        absl::MutexLock lock(&service_->lease_mu_);
        shut_down = service_->leases_shut_down_;
        if (!shut_down) service_->leases_.push_back(this);
      }
      if (shut_down) {
        stream_.device.reset();
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "weight server shutting down"));
        return;
      }
      WriteOffer();
      return;
    }
    NextWrite();
  }

  void OnWriteDone(bool ok) override {
    // A CUDA IPC call is ended by the client (OnCancel) or Shutdown().
    if (stream_.device != nullptr) return;
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    NextWrite();
  }

  void OnCancel() override {
    if (stream_.device != nullptr) EndLease(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    if (stream_.device != nullptr) {
      absl::MutexLock lock(&service_->lease_mu_);
      service_->leases_.remove(this);
    }
    delete this;  // releases the lease (stream_.device)
  }

  // Ends a CUDA IPC call (once: the client's cancel and Shutdown may race).
  void EndLease(grpc::Status status) {
    if (ClaimEnd()) Finish(std::move(status));
  }
  // True for the one caller that may Finish the call; until it does, the
  // reactor is not deleted.
  bool ClaimEnd() { return !lease_ended_.exchange(true); }

 private:
  void WriteOffer() {
    chunk_.Clear();
    chunk_.set_policy_version(stream_.payload.manifest.policy_version());
    *chunk_.mutable_cuda_ipc() = stream_.device->offer;
    StartWrite(&chunk_);
  }

  void NextWrite() {
    if (stream_.segment != nullptr) {
      if (stream_.sent > 0) {
        Finish(grpc::Status::OK);
        return;
      }
      ++stream_.sent;
      chunk_.Clear();
      chunk_.set_policy_version(stream_.payload.manifest.policy_version());
      chunk_.set_bucket(stream_.bucket);
      chunk_.set_offset(stream_.offset);
      *chunk_.mutable_shared_memory() = SegmentMessage(*stream_.segment);
      StartWrite(&chunk_);
      return;
    }
    if (absl::Status s = service_->InjectedFailure(stream_); !s.ok()) {
      Finish(ToGrpc(s));
      return;
    }
    NextChunk next;
    if (!service_->Advance(stream_, &next)) {
      Finish(grpc::Status::OK);
      return;
    }
    chunk_.Clear();
    chunk_.set_policy_version(stream_.payload.manifest.policy_version());
    chunk_.set_bucket(next.bucket);
    chunk_.set_offset(next.offset);
    chunk_.set_data(next.data, next.size);
    chunk_.set_crc32c(next.crc32c);
    chunk_.set_bucket_complete(next.bucket_complete);
    if (next.corrupt) (*chunk_.mutable_data())[next.size / 2] ^= 0x10;
    StartWrite(&chunk_);
  }

  WeightServerService* service_;
  Stream stream_;
  std::atomic<bool> lease_ended_{false};
  v1::WeightChunk chunk_;
};

// A held GetManifest (see weight_server.h). Exactly one of LongPollLoop
// (an answer), CancelLongPoll (the client went away) takes it off polls_
// (clearing `pending`) and finishes it; gRPC deletes it after that.
class WeightServerService::LongPoll : public grpc::ServerUnaryReactor {
 public:
  LongPoll(WeightServerService* service, v1::WeightManifest* response,
           uint64_t newer_than, absl::Time deadline)
      : service_(service),
        response_(response),
        newer_than_(newer_than),
        deadline_(deadline) {}

  void OnCancel() override { service_->CancelLongPoll(this); }
  void OnDone() override { delete this; }

  // Finishes with what an immediate request would get now.
  void Answer() {
    absl::StatusOr<v1::WeightManifest> m = service_->store_->Manifest(0);
    if (m.ok()) *response_ = *std::move(m);
    Finish(ToGrpc(m.status()));
  }

  uint64_t newer_than() const { return newer_than_; }
  absl::Time deadline() const { return deadline_; }

  // Guarded by service_->poll_mu_.
  bool pending = false;
  std::list<LongPoll*>::iterator it;

 private:
  WeightServerService* const service_;
  v1::WeightManifest* const response_;
  const uint64_t newer_than_;
  const absl::Time deadline_;
};

void WeightServerService::LongPollLoop() {
  poll_mu_.Lock();
  for (;;) {
    poll_dirty_ = false;
    // Read after the flag is cleared: a Put from here on sets it again.
    const std::optional<uint64_t> latest = store_->latest_version();
    const absl::Time now = options_.clock->Now();
    absl::Time next = absl::InfiniteFuture();
    std::vector<LongPoll*> ready;
    for (auto it = polls_.begin(); it != polls_.end();) {
      LongPoll* poll = *it;
      if (polls_shut_down_ || now >= poll->deadline() ||
          (latest.has_value() && *latest > poll->newer_than())) {
        poll->pending = false;
        ready.push_back(poll);
        it = polls_.erase(it);
      } else {
        next = std::min(next, poll->deadline());
        ++it;
      }
    }
    if (!ready.empty()) {
      poll_mu_.Unlock();
      for (LongPoll* poll : ready) poll->Answer();
      poll_mu_.Lock();
      continue;
    }
    if (poll_loop_exit_ && polls_.empty()) break;
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(poll_mu_) {
      return poll_dirty_ || poll_loop_exit_;
    };
    if (polls_.empty()) {
      // Nothing held: no deadline to wait for (and no waiter on the clock).
      poll_mu_.Await(absl::Condition(&woken));
    } else {
      options_.clock->AwaitWithDeadline(&poll_mu_, absl::Condition(&woken),
                                        next);
    }
  }
  poll_mu_.Unlock();
}

void WeightServerService::CancelLongPoll(LongPoll* poll) {
  {
    absl::MutexLock lock(&poll_mu_);
    if (!poll->pending) return;  // being answered
    poll->pending = false;
    polls_.erase(poll->it);
  }
  poll->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                            "GetManifest long poll cancelled"));
}

void WeightServerService::Shutdown() {
  {
    absl::MutexLock lock(&poll_mu_);
    polls_shut_down_ = true;
    poll_dirty_ = true;
  }
  // Claimed under the lock (a claimed reactor is not deleted before its
  // Finish), finished outside it (OnDone takes the lock).
  std::vector<FetchReactor*> ending;
  {
    absl::MutexLock lock(&lease_mu_);
    leases_shut_down_ = true;
    for (FetchReactor* reactor : leases_) {
      if (reactor->ClaimEnd()) ending.push_back(reactor);
    }
  }
  for (FetchReactor* reactor : ending) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "weight server shutting down"));
  }
}

WeightServerService::WeightServerService(const WeightStore* store,
                                         WeightServerOptions options)
    : store_(store), options_(std::move(options)) {
  if (options_.metrics != nullptr) options_.metrics->ExposeManifestRequests();
  if (options_.shared_memory) {
    // Segments of a trainer killed with -9 are never unlinked otherwise.
    if (const int n = RemoveStaleWeightSegments(); n > 0) {
      std::fprintf(stderr,
                   "weight server: removed %d stale shared-memory weight "
                   "segment(s) of dead processes from /dev/shm\n",
                   n);
    }
  }
  if (!options_.data_host.empty()) {
    raw_ = RawDataServer::Start(this, options_);
  }
  store_listener_ = store_->AddListener([this](uint64_t /*latest*/) {
    absl::MutexLock lock(&poll_mu_);
    poll_dirty_ = true;
  });
}

WeightServerService::~WeightServerService() {
  store_->RemoveListener(store_listener_);
  Shutdown();
  {
    absl::MutexLock lock(&poll_mu_);
    poll_loop_exit_ = true;
  }
  if (poll_thread_.joinable()) poll_thread_.join();
  raw_.reset();  // joins the connections, which may hold segments
  if (options_.shared_memory) store_->DropSharedSegments();
}

uint16_t WeightServerService::data_port() const {
  return raw_ == nullptr ? 0 : raw_->port();
}

grpc::ServerUnaryReactor* WeightServerService::GetManifest(
    grpc::CallbackServerContext* context, const v1::GetManifestRequest* request,
    v1::WeightManifest* response) {
  if (absl::Status auth = Authorize(*context, "GetManifest"); !auth.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpc(auth));
    return reactor;
  }
  ++manifest_requests_;
  if (raw_ != nullptr) {
    context->AddInitialMetadata(kDataPortMetadata, absl::StrCat(raw_->port()));
  }
  const uint32_t wait_ms = std::min(request->wait_ms(), kMaxLongPollMs);
  if (request->policy_version() == 0 && wait_ms > 0) {
    const std::optional<uint64_t> latest = store_->latest_version();
    if (!latest.has_value() || *latest <= request->newer_than()) {
      absl::MutexLock lock(&poll_mu_);
      if (!polls_shut_down_) {
        // A Put from the check above on is seen by LongPollLoop, which
        // reads the latest version again once woken.
        ++long_polls_;
        if (options_.metrics != nullptr) {
          options_.metrics->RecordManifestRequest(/*held=*/true);
        }
        auto* poll =
            new LongPoll(this, response, request->newer_than(),
                         options_.clock->Now() + absl::Milliseconds(wait_ms));
        poll->pending = true;
        poll->it = polls_.insert(polls_.end(), poll);
        poll_dirty_ = true;
        if (!poll_thread_.joinable()) {
          poll_thread_ = std::thread([this] { LongPollLoop(); });
        }
        return poll;
      }
    }
  }
  if (options_.metrics != nullptr) {
    options_.metrics->RecordManifestRequest(/*held=*/false);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<v1::WeightManifest> m =
      store_->Manifest(request->policy_version());
  if (m.ok()) *response = *std::move(m);
  reactor->Finish(ToGrpc(m.status()));
  return reactor;
}

grpc::ServerWriteReactor<v1::WeightChunk>* WeightServerService::FetchWeights(
    grpc::CallbackServerContext* context,
    const v1::FetchWeightsRequest* request) {
  class Failed : public grpc::ServerWriteReactor<v1::WeightChunk> {
   public:
    explicit Failed(grpc::Status s) { Finish(std::move(s)); }
    void OnDone() override { delete this; }
  };
  if (absl::Status auth = Authorize(*context, "FetchWeights"); !auth.ok()) {
    return new Failed(ToGrpc(auth));
  }
  absl::StatusOr<Stream> stream = OpenStream(*request, /*raw=*/false);
  if (!stream.ok()) return new Failed(ToGrpc(stream.status()));
  return new FetchReactor(this, *std::move(stream));
}

absl::StatusOr<WeightServerService::Stream> WeightServerService::OpenStream(
    const v1::FetchWeightsRequest& request, bool raw) {
  ++streams_;
  const v1::WeightPayloadKind kind =
      request.kind() == v1::WEIGHT_PAYLOAD_KIND_UNSPECIFIED
          ? v1::WEIGHT_PAYLOAD_KIND_FULL
          : request.kind();
  absl::StatusOr<StoredPayload> payload =
      store_->Get(request.policy_version(), kind);
  if (!payload.ok()) return payload.status();
  const v1::WeightManifest& m = payload->manifest;
  if (kind == v1::WEIGHT_PAYLOAD_KIND_DELTA &&
      request.base_version() != m.base_version()) {
    return absl::NotFoundError(absl::StrCat("weights v", m.policy_version(),
                                            " delta is on v", m.base_version(),
                                            ", not v", request.base_version()));
  }
  const uint64_t limit =
      kind == v1::WEIGHT_PAYLOAD_KIND_FULL
          ? (request.start_bucket() < static_cast<uint32_t>(m.buckets_size())
                 ? m.buckets(static_cast<int>(request.start_bucket()))
                       .byte_size()
                 : 0)
          : (request.start_bucket() == 0 ? payload->bytes->size() : 0);
  if (request.start_offset() >= limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resume point (bucket ", request.start_bucket(), ", offset ",
        request.start_offset(), ") is outside weights v", m.policy_version()));
  }
  uint32_t chunk = request.chunk_bytes() == 0 ? options_.max_chunk_bytes
                                              : request.chunk_bytes();
  chunk = std::clamp<uint32_t>(chunk, 1, options_.max_chunk_bytes);
  if (raw) {
    // No message size limit here: 0 asks for whole buckets.
    chunk = request.chunk_bytes() == 0
                ? kMaxRawChunkBytes
                : std::min(request.chunk_bytes(), kMaxRawChunkBytes);
  }
  Stream stream;
  if (!raw && request.has_cuda_ipc() && options_.cuda_ipc != nullptr &&
      kind == v1::WEIGHT_PAYLOAD_KIND_FULL && request.start_bucket() == 0 &&
      request.start_offset() == 0) {
    absl::StatusOr<std::shared_ptr<const DeviceWeightBuffer>> device =
        options_.cuda_ipc->Offer(m.policy_version(), request.cuda_ipc());
    if (device.ok()) {
      stream.device = *std::move(device);
      ++cuda_ipc_offers_;
      if (options_.metrics != nullptr) {
        options_.metrics->RecordBytes(SyncDirection::kSent,
                                      SyncTransport::kCudaIpc, /*full=*/true,
                                      static_cast<double>(m.total_bytes()));
      }
    }
  }
  if (stream.device == nullptr && request.shared_memory() &&
      options_.shared_memory &&
      kind == v1::WEIGHT_PAYLOAD_KIND_FULL) {
    absl::StatusOr<std::shared_ptr<const SharedWeightSegment>> segment =
        store_->SharedFull(m.policy_version());
    if (segment.ok()) {
      stream.segment = *std::move(segment);
      ++shm_offers_;
      if (options_.metrics != nullptr) {
        const uint64_t from =
            m.buckets(static_cast<int>(request.start_bucket())).byte_offset() +
            request.start_offset();
        options_.metrics->RecordBytes(
            SyncDirection::kSent, SyncTransport::kShm, /*full=*/true,
            static_cast<double>(m.total_bytes() - from));
      }
    } else if (!absl::IsNotFound(segment.status())) {
      // Stream the bytes instead; say why once.
      if (shm_failures_.fetch_add(1) == 0) {
        std::fprintf(stderr,
                     "weight server: cannot share weights in memory (%s); "
                     "streaming them instead\n",
                     segment.status().ToString().c_str());
      }
    }
  }
  stream.payload = *std::move(payload);
  stream.bucket = request.start_bucket();
  stream.offset = request.start_offset();
  stream.chunk_bytes = chunk;
  stream.raw = raw;
  return stream;
}

int WeightServerService::held_long_polls() const {
  absl::MutexLock lock(&poll_mu_);
  return static_cast<int>(polls_.size());
}

WeightServerStats WeightServerService::stats() const {
  WeightServerStats stats{streams_.load(),    chunks_.load(),
                          bytes_.load(),      shm_offers_.load(),
                          shm_failures_.load(), cuda_ipc_offers_.load()};
  {
    absl::MutexLock lock(&lease_mu_);
    stats.cuda_ipc_leases = leases_.size();
  }
  stats.manifest_requests = manifest_requests_.load();
  stats.long_polls = long_polls_.load();
  if (raw_ != nullptr) raw_->FillStats(&stats);
  return stats;
}

}  // namespace tandem::weights
