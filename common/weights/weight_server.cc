#include "common/weights/weight_server.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/crc32c.h"

namespace tandem::weights {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace

class WeightServerService::FetchReactor
    : public grpc::ServerWriteReactor<v1::WeightChunk> {
 public:
  FetchReactor(WeightServerService* service, StoredPayload payload,
               uint32_t bucket, uint64_t offset, uint32_t chunk_bytes)
      : service_(service),
        payload_(std::move(payload)),
        bucket_(bucket),
        offset_(offset),
        chunk_bytes_(chunk_bytes) {
    NextWrite();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    NextWrite();
  }

  void OnDone() override { delete this; }

 private:
  bool full() const {
    return payload_.manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL;
  }

  void NextWrite() {
    const auto& m = payload_.manifest;
    const uint32_t num_buckets =
        full() ? static_cast<uint32_t>(m.buckets_size()) : 1;
    if (bucket_ >= num_buckets) {
      Finish(grpc::Status::OK);
      return;
    }
    const int fail_after = service_->fail_after_.load();
    if (fail_after >= 0 && sent_ >= fail_after) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "injected stream failure"));
      return;
    }
    const uint64_t bucket_offset =
        full() ? m.buckets(static_cast<int>(bucket_)).byte_offset() : 0;
    const uint64_t bucket_size =
        full() ? m.buckets(static_cast<int>(bucket_)).byte_size()
               : payload_.bytes->size();
    const uint64_t n = std::min<uint64_t>(chunk_bytes_, bucket_size - offset_);
    const uint8_t* data = payload_.bytes->data() + bucket_offset + offset_;
    chunk_.Clear();
    chunk_.set_policy_version(m.policy_version());
    chunk_.set_bucket(bucket_);
    chunk_.set_offset(offset_);
    chunk_.set_data(data, n);
    chunk_.set_crc32c(kernels::Crc32c(data, n));
    chunk_.set_bucket_complete(offset_ + n == bucket_size);
    const uint64_t index = service_->chunks_.fetch_add(1);
    if (static_cast<int64_t>(index) == service_->corrupt_at_.load() && n > 0) {
      (*chunk_.mutable_data())[n / 2] ^= 0x10;
    }
    service_->bytes_ += n;
    if (service_->options_.metrics != nullptr) {
      service_->options_.metrics->RecordBytes(SyncDirection::kSent,
                                              SyncTransport::kPull, full(),
                                              static_cast<double>(n));
    }
    ++sent_;
    offset_ += n;
    if (offset_ == bucket_size) {
      ++bucket_;
      offset_ = 0;
    }
    StartWrite(&chunk_);
  }

  WeightServerService* service_;
  StoredPayload payload_;
  uint32_t bucket_;
  uint64_t offset_;
  const uint32_t chunk_bytes_;
  int sent_ = 0;
  v1::WeightChunk chunk_;
};

WeightServerService::WeightServerService(const WeightStore* store,
                                         WeightServerOptions options)
    : store_(store), options_(options) {}

grpc::ServerUnaryReactor* WeightServerService::GetManifest(
    grpc::CallbackServerContext* context, const v1::GetManifestRequest* request,
    v1::WeightManifest* response) {
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
  ++streams_;
  auto fail = [](grpc::Status status) {
    class Failed : public grpc::ServerWriteReactor<v1::WeightChunk> {
     public:
      explicit Failed(grpc::Status s) { Finish(std::move(s)); }
      void OnDone() override { delete this; }
    };
    return new Failed(std::move(status));
  };
  const v1::WeightPayloadKind kind =
      request->kind() == v1::WEIGHT_PAYLOAD_KIND_UNSPECIFIED
          ? v1::WEIGHT_PAYLOAD_KIND_FULL
          : request->kind();
  absl::StatusOr<StoredPayload> payload =
      store_->Get(request->policy_version(), kind);
  if (!payload.ok()) return fail(ToGrpc(payload.status()));
  const v1::WeightManifest& m = payload->manifest;
  if (kind == v1::WEIGHT_PAYLOAD_KIND_DELTA &&
      request->base_version() != m.base_version()) {
    return fail(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("weights v", m.policy_version(), " delta is on v",
                     m.base_version(), ", not v", request->base_version())));
  }
  const uint64_t limit =
      kind == v1::WEIGHT_PAYLOAD_KIND_FULL
          ? (request->start_bucket() < static_cast<uint32_t>(m.buckets_size())
                 ? m.buckets(static_cast<int>(request->start_bucket()))
                       .byte_size()
                 : 0)
          : (request->start_bucket() == 0 ? payload->bytes->size() : 0);
  if (request->start_offset() >= limit) {
    return fail(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("resume point (bucket ", request->start_bucket(),
                     ", offset ", request->start_offset(),
                     ") is outside weights v", m.policy_version())));
  }
  uint32_t chunk = request->chunk_bytes() == 0 ? options_.max_chunk_bytes
                                               : request->chunk_bytes();
  chunk = std::clamp<uint32_t>(chunk, 1, options_.max_chunk_bytes);
  return new FetchReactor(this, *std::move(payload), request->start_bucket(),
                          request->start_offset(), chunk);
}

WeightServerStats WeightServerService::stats() const {
  return {streams_.load(), chunks_.load(), bytes_.load()};
}

}  // namespace tandem::weights
