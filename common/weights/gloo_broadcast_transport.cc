#include "common/weights/gloo_broadcast_transport.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/store_client.h"

namespace tandem::weights {
namespace {

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
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
    } else if (config.rank == 0) {
      auto hosted = GlooRendezvousStore::Create(
          config.store_host, config.store_port, config.timeout);
      if (!hosted.ok()) {
        return absl::Status(hosted.status().code(),
                            absl::StrCat(where, ": ", hosted.status().message()));
      }
      impl->store = (*hosted)->impl_->store;
    } else {
      auto client = ConnectStoreClient(config.store_host, config.store_port,
                                       config.timeout);
      if (!client.ok()) {
        return absl::Status(client.status().code(),
                            absl::StrCat(where, ": rendezvous failed: ",
                                         client.status().message()));
      }
      impl->store = *std::move(client);
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
uint64_t GlooBroadcastGroup::piece_bytes() const {
  return impl_->config.piece_bytes;
}

absl::Status GlooBroadcastGroup::Broadcast(absl::Span<uint8_t> bytes) {
  return StartBroadcast(bytes)();
}

std::function<absl::Status()> GlooBroadcastGroup::StartBroadcast(
    absl::Span<uint8_t> bytes) {
  auto done = [](absl::Status s) { return [s] { return s; }; };
  if (impl_->broken.load()) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("gloo group ", impl_->config.key_prefix,
                     " is broken; the next epoch must be formed")));
  }
  if (bytes.empty()) return done(absl::OkStatus());
  auto failed = [impl = impl_.get(), size = bytes.size()](const char* what) {
    impl->broken = true;
    return absl::UnavailableError(
        absl::StrCat("gloo broadcast of ", size, " bytes failed: ", what));
  };
  c10::intrusive_ptr<c10d::Work> work;
  try {
    // The bytes as they are (uint8): LibTorch 1.13's Gloo needed them viewed
    // as float32, so buffers had to be 4-byte aligned multiples of 4.
    at::Tensor view =
        at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())},
                      at::TensorOptions().dtype(at::kByte));
    std::vector<at::Tensor> tensors{view};
    c10d::BroadcastOptions options;
    options.rootRank = 0;
    options.timeout = ToMillis(impl_->config.timeout);
    // Queued to the group's worker thread; returns before the bytes move.
    work = impl_->group->broadcast(tensors, options);
  } catch (const std::exception& e) {
    return done(failed(e.what()));
  }
  return [impl = impl_.get(), work, size = bytes.size(), failed] {
    try {
      if (!work->wait(ToMillis(impl->config.timeout))) {
        impl->broken = true;
        return absl::DeadlineExceededError(absl::StrCat(
            "gloo broadcast of ", size, " bytes did not finish within ",
            absl::FormatDuration(impl->config.timeout)));
      }
    } catch (const std::exception& e) {
      return failed(e.what());
    }
    return absl::OkStatus();
  };
}

}  // namespace tandem::weights
