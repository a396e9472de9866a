#include "common/weights/broadcast/gloo_broadcast_transport.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <typeinfo>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/posix.h"
#include "common/weights/broadcast/forwarding_store.h"
#include "common/weights/broadcast/rendezvous_store.h"
#include "common/weights/broadcast/store_client.h"

namespace tandem::weights {
namespace {

auto Log() { return ComponentLogger("weights"); }

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// c10d gives ProcessGroupGloo no abort() (ProcessGroupNCCL::abort() has no
// Gloo counterpart), and a Gloo collective waits on its buffers' condition
// variables until its own timeout: closing a pair's socket does not wake
// it. What does wake it is an I/O failure of a pair, which hands the
// exception to every pending send and receive and closes the socket (the
// peers then see a reset and fail too): gloo::transport::tcp::Pair::
// signalExceptionExternal, the call Gloo itself makes when an operation
// times out. GlooAbort makes that call on every pair of the group.
//
// The wheel ships no Gloo headers, and Debian's (2022) do not match the
// Gloo inside LibTorch (gloo::Context's layout differs), so nothing here
// depends on a Gloo class layout: the contexts come from c10d's own header
// (a protected member, reached through a pointer to member formed in a
// derived class), the pairs from gloo::Context::getPair (an exported
// function), the pair's type from its RTTI, and signalExceptionExternal by
// its exported symbol. Without that symbol (another LibTorch), Abort falls
// back to closeConnections(): peers fail at once, this rank's collective
// at its deadline.
struct GlooContexts : c10d::ProcessGroupGloo {
  static const std::vector<std::shared_ptr<::gloo::Context>>& Of(
      const c10d::ProcessGroupGloo& group) {
    return group.*(&GlooContexts::contexts_);
  }
};

// std::exception_ptr gloo::transport::tcp::Pair::signalExceptionExternal(
//     const std::string&), as a function of the pair (Itanium ABI: the
// return slot, then `this`, then the argument, as for this signature).
using SignalPairFn = std::exception_ptr (*)(void* pair, const std::string&);

SignalPairFn SignalPair() {
  static const SignalPairFn fn = reinterpret_cast<SignalPairFn>(dlsym(
      RTLD_DEFAULT,
      "_ZN4gloo9transport3tcp4Pair23signalExceptionExternalERKNSt7__cxx1112"
      "basic_stringIcSt11char_traitsIcESaIcEEE"));
  return fn;
}

// Fails every connection of `group` (any thread): collectives blocked in
// it, here and, through the reset sockets, at the peers, fail at once.
// False when this LibTorch's Gloo offers no way to (see above).
bool GlooAbort(const c10d::ProcessGroupGloo& group, const std::string& why) {
  const SignalPairFn signal = SignalPair();
  bool interrupted = true;
  for (const std::shared_ptr<::gloo::Context>& context :
       GlooContexts::Of(group)) {
    bool tcp = signal != nullptr;
    for (int rank = 0; tcp && rank < group.getSize(); ++rank) {
      const ::gloo::transport::Pair* pair = context->getPair(rank).get();
      tcp = pair == nullptr ||  // this rank
            std::strcmp(typeid(*pair).name(), "N4gloo9transport3tcp4PairE") == 0;
    }
    if (!tcp) {
      context->closeConnections();
      interrupted = false;
      continue;
    }
    for (int rank = 0; rank < group.getSize(); ++rank) {
      // tcp::Pair's first base is transport::Pair: the same address.
      ::gloo::transport::Pair* pair = context->getPair(rank).get();
      if (pair != nullptr) signal(pair, why);
    }
  }
  return interrupted;
}

// The rendezvous store of one group: every wait ends at the rendezvous
// deadline (the group's timeout, counted from Create), whatever timeout
// Gloo asks for, and, when another thread may end the rendezvous
// (BroadcastGroupConfig::cancelled), waits are cut into short slices that
// check the flag, so Gloo's rendezvous (store gets and waits inside the
// ProcessGroupGloo constructor) throws soon after the flag is set rather
// than at the deadline. Everything else goes to `inner`.
//
// Why the store keeps its own deadline: Gloo gives each pair's connect
// kGlooConnectAttempts tries of the context timeout, so Create hands Gloo
// a context timeout of timeout / kGlooConnectAttempts (see there), and the
// waits for the other members' addresses must not shrink with it.
//
// Over a rendezvous keyspace (`long_poll`: KeyspaceStore, the trainer's
// gRPC store) a wait is a series of the keyspace's own waits of at most
// kWaitSlice, which return as soon as the keys are set (a long poll at
// the trainer), rather than checks 20 ms apart.
class RendezvousStore : public ForwardingStore {
 public:
  RendezvousStore(c10::intrusive_ptr<c10d::Store> inner,
                  std::chrono::steady_clock::time_point deadline,
                  const std::atomic<bool>* cancelled, bool long_poll)
      : ForwardingStore(std::move(inner)),
        deadline_(deadline),
        cancelled_(cancelled),
        long_poll_(long_poll) {}

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<RendezvousStore>(inner()->clone(), deadline_,
                                                cancelled_, long_poll_);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    wait({key});
    return inner()->get(key);
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, timeout_);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& /*gloo's timeout*/) override {
    while (!Ready(keys)) {
      if (cancelled_ != nullptr && cancelled_->load()) {
        throw std::runtime_error("rendezvous cancelled (the member is stopping)");
      }
      if (std::chrono::steady_clock::now() >= deadline_) {
        throw std::runtime_error(
            "rendezvous keys not set by the rendezvous deadline");
      }
      if (!long_poll_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  std::vector<std::vector<uint8_t>> multiGet(
      const std::vector<std::string>& keys) override {
    wait(keys);
    return inner()->multiGet(keys);
  }

 private:
  static constexpr std::chrono::milliseconds kWaitSlice{100};

  // Whether `keys` are set: a check, or a wait of one slice.
  bool Ready(const std::vector<std::string>& keys) {
    if (!long_poll_) return inner()->check(keys);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline_ - std::chrono::steady_clock::now());
    try {
      inner()->wait(keys, std::clamp(left, std::chrono::milliseconds(1),
                                     kWaitSlice));
      return true;
    } catch (const RendezvousWaitTimeout&) {
      return false;
    }
  }

  const std::chrono::steady_clock::time_point deadline_;
  const std::atomic<bool>* const cancelled_;  // may be null
  const bool long_poll_;
};

// How many times Gloo's full-mesh connect (LibTorch 2.11's Gloo) tries a
// pair, each try bounded by the context timeout: measured, a member killed
// after it published its address in the store made the others' connect
// fail after 5.0-5.2 x the context timeout
// (tests/unit/weights_gloo_dying_peer_test.cc, 15.4 s at 3 s).
constexpr int kGlooConnectAttempts = 5;

// LibTorch's TCPStore server listens on every interface whatever host it is
// given, but takes over a socket that already listens
// (TCPStoreOptions::masterListenFd). So when `host` is an IPv4 address of
// this machine the store listens on it alone, as the raw data port does;
// a store reachable on every interface of a pod or node is reachable from
// networks the trainer never meant to serve. Returns the listening socket
// and its port, or nullopt for a host that is not an IPv4 address or is
// 0.0.0.0 (LibTorch's own listener then, as before).
absl::StatusOr<std::optional<std::pair<int, uint16_t>>> ListenOnHost(
    const std::string& host, uint16_t port) {
  in_addr any{};
  if (inet_pton(AF_INET, host.c_str(), &any) != 1 ||
      any.s_addr == htonl(INADDR_ANY)) {
    return std::nullopt;
  }
  uint16_t bound = 0;
  absl::StatusOr<int> fd = ListenTcp4(host, port, 0, &bound);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(),
                        absl::StrCat("rendezvous store: ", fd.status().message()));
  }
  return std::make_pair(*fd, bound);
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
  auto listener = ListenOnHost(host, port);
  if (!listener.ok()) return absl::UnavailableError(listener.status().message());
  try {
    c10d::TCPStoreOptions options;
    options.port = port;
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = ToMillis(timeout);
    if (listener->has_value()) {
      // The store owns the socket from here on (it closes it).
      options.masterListenFd = (*listener)->first;
      options.port = (*listener)->second;
    }
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
  std::atomic<bool> aborted{false};  // Abort() failed the pairs
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
  const std::string where = absl::StrCat(
      "gloo group ", config.key_prefix, " rank ", config.rank, "/",
      config.world_size,
      config.rendezvous != nullptr
          ? std::string(" (rendezvous over the trainer's gRPC)")
          : absl::StrCat(" (store ", config.store_host, ":", config.store_port,
                         ")"));
  // The rendezvous (addresses in the store, then the pairs' connects) ends
  // by this deadline, plus at most one timeout when the last address came
  // just before it.
  const auto deadline = std::chrono::steady_clock::now() + ToMillis(config.timeout);
  try {
    if (config.rendezvous != nullptr) {
      impl->store = c10::make_intrusive<KeyspaceStore>(
          config.rendezvous, config.key_prefix, ToMillis(config.timeout));
    } else if (server != nullptr) {
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
    if (config.cancelled != nullptr && config.cancelled->load()) {
      return absl::CancelledError(
          absl::StrCat(where, ": rendezvous cancelled before it started"));
    }
    c10::intrusive_ptr<c10d::Store> prefixed =
        c10::make_intrusive<RendezvousStore>(
            c10::make_intrusive<c10d::PrefixStore>(config.key_prefix,
                                                   impl->store),
            deadline, config.cancelled,
            /*long_poll=*/config.rendezvous != nullptr);
    // The context timeout bounds each of Gloo's connect tries (and nothing
    // else here: every broadcast passes its own timeout), so a member that
    // died after publishing its address fails the others' connect within
    // about one timeout rather than kGlooConnectAttempts of them.
    auto options = c10d::ProcessGroupGloo::Options::create(
        std::max(std::chrono::milliseconds(100),
                 ToMillis(config.timeout / kGlooConnectAttempts)));
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(config.bind_host));
    options->threads = 1;
    impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        prefixed, config.rank, config.world_size, options);
  } catch (const std::exception& e) {
    if (config.cancelled != nullptr && config.cancelled->load()) {
      return absl::CancelledError(
          absl::StrCat(where, ": rendezvous cancelled: ", e.what()));
    }
    return absl::UnavailableError(
        absl::StrCat(where, ": rendezvous failed: ", e.what()));
  }
  return std::unique_ptr<GlooBroadcastGroup>(
      new GlooBroadcastGroup(std::move(impl)));
}

int GlooBroadcastGroup::rank() const { return impl_->config.rank; }
int GlooBroadcastGroup::world_size() const { return impl_->config.world_size; }
bool GlooBroadcastGroup::broken() const { return impl_->broken.load(); }
void GlooBroadcastGroup::Abort() {
  impl_->broken = true;
  if (impl_->aborted.exchange(true)) return;
  if (!GlooAbort(*impl_->group,
                 absl::StrCat("gloo group ", impl_->config.key_prefix,
                              " rank ", impl_->config.rank,
                              " aborted (Abort() called)"))) {
    Log()->warn(
        "gloo group {}: this LibTorch's Gloo cannot interrupt a collective; "
        "closed the group's connections instead (a collective under way "
        "ends at its deadline, {})",
        impl_->config.key_prefix, absl::FormatDuration(impl_->config.timeout));
  }
}
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
