#include "services/trainer/rendezvous_service.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"
#include "common/rpc/peer_identity.h"

namespace tandem::trainer {
namespace {

// The members of broadcast groups: the trainer (rank 0) and rollout
// workers. Not the coordinator, verifier or an admin: none of them takes
// part in a group, and whoever can write the store can redirect the pairs.
constexpr rpc::PeerRoleSet kRendezvousRoles = {rpc::PeerRole::kTrainer,
                                               rpc::PeerRole::kRollout};

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(rpc::ToGrpcStatus(status));
  return reactor;
}

// Runs `handle` (which returns the call's status) when the caller was
// authorized, and finishes the call with the one status or the other.
template <typename Handle>
grpc::ServerUnaryReactor* ServeIf(grpc::CallbackServerContext* context,
                                  absl::Status authorized, Handle&& handle) {
  if (authorized.ok()) authorized = handle();
  return Finish(context, authorized);
}

// Hands an answer to `set` when there is one; returns its status.
template <typename T, typename Set>
absl::Status Reply(absl::StatusOr<T> value, Set&& set) {
  if (value.ok()) set(*std::move(value));
  return value.status();
}

}  // namespace

// A held StoreWait. Exactly one of WaitLoop (an answer) and CancelWait
// (the client went away) takes it off waits_ (clearing `pending`) and
// finishes it; gRPC deletes it after that.
class RendezvousService::HeldWait : public grpc::ServerUnaryReactor {
 public:
  HeldWait(RendezvousService* service,
           const tandem::v1::StoreWaitRequest* request,
           tandem::v1::StoreWaitResponse* response, absl::Time deadline)
      : service_(service),
        scope_(request->scope()),
        keys_(request->keys().begin(), request->keys().end()),
        response_(response),
        deadline_(deadline) {}

  void OnCancel() override { service_->CancelWait(this); }
  void OnDone() override { delete this; }

  // Whether to answer now (the keys are set, the scope is gone, or time is
  // up); `status`/`ready` then say what.
  bool Due(absl::Time now, bool shut_down) {
    absl::StatusOr<bool> ready =
        service_->keys_->Wait(scope_, keys_, absl::ZeroDuration());
    if (!ready.ok() || *ready || shut_down || now >= deadline_) {
      status_ = ready.status();
      response_->set_ready(ready.ok() && *ready);
      return true;
    }
    return false;
  }
  void Answer() { Finish(rpc::ToGrpcStatus(status_)); }
  absl::Time deadline() const { return deadline_; }

  // Guarded by service_->mu_.
  bool pending = false;
  std::list<HeldWait*>::iterator it;

 private:
  RendezvousService* const service_;
  const std::string scope_;
  const std::vector<std::string> keys_;
  tandem::v1::StoreWaitResponse* const response_;
  const absl::Time deadline_;
  absl::Status status_;
};

RendezvousService::RendezvousService(
    std::shared_ptr<weights::RendezvousKeys> keys, bool tls_enabled,
    prometheus::Family<prometheus::Counter>* auth_refused)
    : keys_(std::move(keys)),
      tls_enabled_(tls_enabled),
      auth_refused_(auth_refused) {
  keys_->SetChangeListener([this] {
    absl::MutexLock lock(&mu_);
    dirty_ = true;
  });
}

RendezvousService::~RendezvousService() {
  keys_->SetChangeListener(nullptr);
  Shutdown();
  {
    absl::MutexLock lock(&mu_);
    exit_ = true;
  }
  if (loop_.joinable()) loop_.join();
}

void RendezvousService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  dirty_ = true;
}

absl::Status RendezvousService::Authorize(
    const grpc::CallbackServerContext& context, const char* rpc) const {
  absl::Status status =
      rpc::AuthorizePeer(context, tls_enabled_, rpc, kRendezvousRoles);
  if (status.ok()) return status;
  const char* reason = rpc::AuthRefusalReason(status);
  if (auth_refused_ != nullptr) {
    auth_refused_->Add({{"reason", reason}}).Increment();
  }
  ComponentLogger("trainer")->warn("refused {} from {} ({}): {}", rpc,
                                   context.peer(), reason,
                                   std::string(status.message()));
  return status;
}

grpc::ServerUnaryReactor* RendezvousService::StoreSet(
    grpc::CallbackServerContext* context,
    const tandem::v1::StoreSetRequest* request,
    tandem::v1::StoreSetResponse* /*response*/) {
  return ServeIf(context, Authorize(*context, "StoreSet"), [&] {
    return keys_->Set(request->scope(), request->key(), request->value());
  });
}

grpc::ServerUnaryReactor* RendezvousService::StoreGet(
    grpc::CallbackServerContext* context,
    const tandem::v1::StoreKeyRequest* request,
    tandem::v1::StoreValueResponse* response) {
  return ServeIf(context, Authorize(*context, "StoreGet"), [&] {
    return Reply(keys_->Get(request->scope(), request->key()),
                 [&](std::string v) { response->set_value(std::move(v)); });
  });
}

grpc::ServerUnaryReactor* RendezvousService::StoreAdd(
    grpc::CallbackServerContext* context,
    const tandem::v1::StoreAddRequest* request,
    tandem::v1::StoreAddResponse* response) {
  return ServeIf(context, Authorize(*context, "StoreAdd"), [&] {
    return Reply(
        keys_->Add(request->scope(), request->key(), request->delta()),
        [&](int64_t sum) { response->set_value(sum); });
  });
}

grpc::ServerUnaryReactor* RendezvousService::StoreCompareSet(
    grpc::CallbackServerContext* context,
    const tandem::v1::StoreCompareSetRequest* request,
    tandem::v1::StoreValueResponse* response) {
  return ServeIf(context, Authorize(*context, "StoreCompareSet"), [&] {
    return Reply(keys_->CompareSet(request->scope(), request->key(),
                                   request->expected(), request->desired()),
                 [&](std::string v) { response->set_value(std::move(v)); });
  });
}

grpc::ServerUnaryReactor* RendezvousService::StoreDeleteKey(
    grpc::CallbackServerContext* context,
    const tandem::v1::StoreKeyRequest* request,
    tandem::v1::StoreDeleteKeyResponse* response) {
  return ServeIf(context, Authorize(*context, "StoreDeleteKey"), [&] {
    return Reply(keys_->DeleteKey(request->scope(), request->key()),
                 [&](bool deleted) { response->set_deleted(deleted); });
  });
}

grpc::ServerUnaryReactor* RendezvousService::StoreNumKeys(
    grpc::CallbackServerContext* context,
    const tandem::v1::StoreNumKeysRequest* request,
    tandem::v1::StoreNumKeysResponse* response) {
  return ServeIf(context, Authorize(*context, "StoreNumKeys"), [&] {
    return Reply(keys_->NumKeys(request->scope()),
                 [&](int64_t n) { response->set_num_keys(n); });
  });
}

grpc::ServerUnaryReactor* RendezvousService::StoreWait(
    grpc::CallbackServerContext* context,
    const tandem::v1::StoreWaitRequest* request,
    tandem::v1::StoreWaitResponse* response) {
  if (absl::Status auth = Authorize(*context, "StoreWait"); !auth.ok()) {
    return Finish(context, auth);
  }
  const uint32_t wait_ms = std::min(request->wait_ms(), kMaxWaitMs);
  auto* wait = new HeldWait(this, request, response,
                            absl::Now() + absl::Milliseconds(wait_ms));
  {
    absl::MutexLock lock(&mu_);
    if (wait_ms > 0 && !shut_down_ && !wait->Due(absl::Now(), false)) {
      // A key set from the check above on marks dirty_: WaitLoop looks
      // again once woken.
      wait->pending = true;
      wait->it = waits_.insert(waits_.end(), wait);
      dirty_ = true;
      if (!loop_.joinable()) loop_ = std::thread([this] { WaitLoop(); });
      return wait;
    }
  }
  wait->Due(absl::Now(), /*shut_down=*/true);
  wait->Answer();
  return wait;
}

void RendezvousService::WaitLoop() {
  mu_.Lock();
  for (;;) {
    dirty_ = false;
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    std::vector<HeldWait*> due;
    for (auto it = waits_.begin(); it != waits_.end();) {
      HeldWait* wait = *it;
      if (wait->Due(now, shut_down_)) {
        wait->pending = false;
        due.push_back(wait);
        it = waits_.erase(it);
      } else {
        next = std::min(next, wait->deadline());
        ++it;
      }
    }
    if (!due.empty()) {
      mu_.Unlock();
      for (HeldWait* wait : due) wait->Answer();
      mu_.Lock();
      continue;
    }
    if (exit_ && waits_.empty()) break;
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return dirty_ || exit_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&woken), next);
  }
  mu_.Unlock();
}

void RendezvousService::CancelWait(HeldWait* wait) {
  {
    absl::MutexLock lock(&mu_);
    if (!wait->pending) return;  // being answered
    wait->pending = false;
    waits_.erase(wait->it);
  }
  wait->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                            "StoreWait cancelled by the client"));
}

}  // namespace tandem::trainer
