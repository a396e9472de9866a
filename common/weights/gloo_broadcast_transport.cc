#include "common/weights/gloo_broadcast_transport.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::weights {
namespace {

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

uint64_t RoundUp4(uint64_t n) { return (n + 3) & ~uint64_t{3}; }

// A 4-byte aligned scratch buffer whose size is a multiple of 4.
std::vector<float> Scratch(uint64_t bytes) {
  return std::vector<float>(RoundUp4(bytes) / 4);
}

absl::Span<uint8_t> AsBytes(std::vector<float>& v) {
  return {reinterpret_cast<uint8_t*>(v.data()), v.size() * 4};
}

}  // namespace

struct GlooRendezvousStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

GlooRendezvousStore::GlooRendezvousStore(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
GlooRendezvousStore::~GlooRendezvousStore() = default;

absl::StatusOr<std::unique_ptr<GlooRendezvousStore>>
GlooRendezvousStore::Create(const std::string& host, uint16_t port,
                            absl::Duration timeout) {
  auto impl = std::make_unique<Impl>();
  try {
    c10d::TCPStoreOptions options;
    options.port = port;
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = ToMillis(timeout);
    impl->store = c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("TCPStore server on ", host, ":",
                                               port, " failed: ", e.what()));
  }
  return std::unique_ptr<GlooRendezvousStore>(
      new GlooRendezvousStore(std::move(impl)));
}

uint16_t GlooRendezvousStore::port() const { return impl_->store->getPort(); }

struct GlooBroadcastGroup::Impl {
  GlooGroupConfig config;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  std::atomic<bool> broken{false};
};

GlooBroadcastGroup::GlooBroadcastGroup(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

GlooBroadcastGroup::~GlooBroadcastGroup() = default;

absl::StatusOr<std::unique_ptr<GlooBroadcastGroup>> GlooBroadcastGroup::Create(
    const GlooGroupConfig& config, const GlooRendezvousStore* server) {
  if (config.world_size < 1 || config.rank < 0 ||
      config.rank >= config.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo group: rank ", config.rank, " outside world_size ",
                     config.world_size));
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  const std::string where =
      absl::StrCat("gloo group ", config.key_prefix, " rank ", config.rank, "/",
                   config.world_size, " (store ", config.store_host, ":",
                   config.store_port, ")");
  try {
    if (server != nullptr) {
      impl->store = server->impl_->store;
    } else {
      c10d::TCPStoreOptions store_options;
      store_options.port = config.store_port;
      store_options.isServer = config.rank == 0;
      store_options.waitWorkers = false;
      store_options.timeout = ToMillis(config.timeout);
      impl->store =
          c10::make_intrusive<c10d::TCPStore>(config.store_host, store_options);
    }
    auto prefixed =
        c10::make_intrusive<c10d::PrefixStore>(config.key_prefix, impl->store);
    auto options =
        c10d::ProcessGroupGloo::Options::create(ToMillis(config.timeout));
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(config.bind_host));
    options->threads = 1;
    impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        prefixed, config.rank, config.world_size, options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(where, ": rendezvous failed: ", e.what()));
  }
  return std::unique_ptr<GlooBroadcastGroup>(
      new GlooBroadcastGroup(std::move(impl)));
}

int GlooBroadcastGroup::rank() const { return impl_->config.rank; }
int GlooBroadcastGroup::world_size() const { return impl_->config.world_size; }
bool GlooBroadcastGroup::broken() const { return impl_->broken.load(); }
void GlooBroadcastGroup::Abort() { impl_->broken = true; }

absl::Status GlooBroadcastGroup::Broadcast(absl::Span<uint8_t> bytes) {
  if (impl_->broken.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("gloo group ", impl_->config.key_prefix,
                     " is broken; the next epoch must be formed"));
  }
  if (bytes.size() % 4 != 0 ||
      reinterpret_cast<uintptr_t>(bytes.data()) % 4 != 0) {
    return absl::InvalidArgumentError(
        "gloo broadcast needs a 4-byte aligned multiple of 4 bytes");
  }
  if (bytes.empty()) return absl::OkStatus();
  try {
    // Gloo in LibTorch 1.13 rejects bf16/int16: send the bytes as float32.
    at::Tensor view =
        at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size() / 4)},
                      at::TensorOptions().dtype(at::kFloat));
    std::vector<at::Tensor> tensors{view};
    c10d::BroadcastOptions options;
    options.rootRank = 0;
    options.timeout = ToMillis(impl_->config.timeout);
    c10::intrusive_ptr<c10d::Work> work =
        impl_->group->broadcast(tensors, options);
    if (!work->wait(ToMillis(impl_->config.timeout))) {
      impl_->broken = true;
      return absl::DeadlineExceededError(absl::StrCat(
          "gloo broadcast of ", bytes.size(), " bytes did not finish within ",
          absl::FormatDuration(impl_->config.timeout)));
    }
  } catch (const std::exception& e) {
    impl_->broken = true;
    return absl::UnavailableError(absl::StrCat(
        "gloo broadcast of ", bytes.size(), " bytes failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status GlooWeightSender::Publish(const v1::WeightManifest& manifest,
                                       absl::Span<const uint8_t> payload,
                                       absl::Time /*deadline*/) {
  const std::string serialized = manifest.SerializeAsString();
  uint64_t header[2] = {serialized.size(), payload.size()};
  if (absl::Status s = group_->Broadcast(
          {reinterpret_cast<uint8_t*>(header), sizeof(header)});
      !s.ok()) {
    return s;
  }
  std::vector<float> scratch = Scratch(serialized.size());
  std::memcpy(scratch.data(), serialized.data(), serialized.size());
  if (absl::Status s = group_->Broadcast(AsBytes(scratch)); !s.ok()) return s;
  // Root buffers are only read by Gloo; the const_cast never writes.
  auto* data = const_cast<uint8_t*>(payload.data());
  if (manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL) {
    for (const v1::BucketSpec& b : manifest.buckets()) {
      if (absl::Status s = group_->Broadcast(
              {data + b.byte_offset(), static_cast<size_t>(b.byte_size())});
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  const uint64_t piece = std::max<uint64_t>(manifest.bucket_bytes(), 4);
  for (uint64_t off = 0; off < payload.size(); off += piece) {
    const uint64_t n = std::min(piece, payload.size() - off);
    std::vector<float> buf = Scratch(n);
    std::memcpy(buf.data(), data + off, n);
    if (absl::Status s = group_->Broadcast(AsBytes(buf)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> GlooWeightReceiver::ReceiveNext(
    StagingWeights* staging, absl::Time /*deadline*/) {
  uint64_t header[2] = {0, 0};
  if (absl::Status s = group_->Broadcast(
          {reinterpret_cast<uint8_t*>(header), sizeof(header)});
      !s.ok()) {
    return s;
  }
  std::vector<float> manifest_bytes = Scratch(header[0]);
  if (absl::Status s = group_->Broadcast(AsBytes(manifest_bytes)); !s.ok()) {
    return s;
  }
  v1::WeightManifest manifest;
  if (!manifest.ParseFromArray(manifest_bytes.data(),
                               static_cast<int>(header[0]))) {
    group_->Abort();  // cannot know how many broadcasts follow
    return absl::DataLossError("gloo: received an unparsable manifest");
  }
  last_round_version_ = manifest.policy_version();
  // From here on every broadcast of the version is joined, whatever
  // happens locally; `local` records the first local failure.
  absl::Status local = staging->Begin(manifest);
  const bool staging_ok = local.ok();
  if (manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL) {
    std::vector<float> scratch;
    for (int i = 0; i < manifest.buckets_size(); ++i) {
      const v1::BucketSpec& b = manifest.buckets(i);
      absl::Span<uint8_t> dst;
      if (staging_ok && local.ok()) {
        absl::StatusOr<absl::Span<uint8_t>> bucket =
            staging->MutableBucket(static_cast<uint32_t>(i));
        if (bucket.ok()) {
          dst = *bucket;
        } else {
          local = bucket.status();
        }
      }
      if (dst.empty() && b.byte_size() > 0) {
        scratch = Scratch(b.byte_size());
        dst = AsBytes(scratch).subspan(0, b.byte_size());
      }
      if (absl::Status s = group_->Broadcast(dst); !s.ok()) {
        staging->Abort();
        return s;
      }
      if (staging_ok && local.ok()) {
        local = staging->FinishBucket(static_cast<uint32_t>(i));
      }
    }
  } else {
    std::vector<uint8_t> delta(header[1]);
    const uint64_t piece = std::max<uint64_t>(manifest.bucket_bytes(), 4);
    for (uint64_t off = 0; off < delta.size(); off += piece) {
      const uint64_t n = std::min(piece, delta.size() - off);
      std::vector<float> buf = Scratch(n);
      if (absl::Status s = group_->Broadcast(AsBytes(buf)); !s.ok()) {
        staging->Abort();
        return s;
      }
      std::memcpy(delta.data() + off, buf.data(), n);
    }
    if (local.ok()) local = staging->ApplyDelta(delta);
  }
  if (!local.ok()) {
    if (staging_ok) staging->Abort();
    return local;
  }
  return manifest.policy_version();
}

}  // namespace tandem::weights
