#pragma once

// RendezvousService: the trainer's gRPC Rendezvous service
// (proto/tandem/v1/rendezvous.proto), the rendezvous store of broadcast
// groups when the cluster runs mTLS (docs/operations.md, "The broadcast
// rendezvous store"). It serves the trainer's RendezvousKeys
// (common/weights/broadcast/rendezvous_keys.h), which the trainer's own
// member of each group uses in-process, to the rollout workers.
//
// Authorization: like the weight server's GetManifest/FetchWeights, but
// only the trainer and rollout roles (with TLS on); a refusal is
// PERMISSION_DENIED (UNAUTHENTICATED without a certificate), counted in
// `auth_refused` and logged with the peer.
//
// StoreWait is a bounded long poll (at most kMaxWaitMs; clients loop):
// a wait that cannot be answered at once is held, without blocking a gRPC
// thread, by one loop thread that answers it when a key changes or its
// time is up. Shutdown() answers every held wait (not ready) and refuses
// new ones; the destructor joins the loop thread.
//
// Thread-safety: the RPCs from any gRPC thread; Shutdown from the owner.

#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>

#include <cstdint>
#include <list>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/weights/broadcast/rendezvous_keys.h"
#include "tandem/v1/rendezvous.grpc.pb.h"

namespace tandem::trainer {

class RendezvousService : public tandem::v1::Rendezvous::CallbackService {
 public:
  static constexpr uint32_t kMaxWaitMs = 5000;

  // `auth_refused` (may be null) must outlive the service.
  RendezvousService(std::shared_ptr<weights::RendezvousKeys> keys,
                    bool tls_enabled,
                    prometheus::Family<prometheus::Counter>* auth_refused);
  ~RendezvousService() override;

  void Shutdown();

  grpc::ServerUnaryReactor* StoreSet(
      grpc::CallbackServerContext* context,
      const tandem::v1::StoreSetRequest* request,
      tandem::v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* StoreGet(
      grpc::CallbackServerContext* context,
      const tandem::v1::StoreKeyRequest* request,
      tandem::v1::StoreValueResponse* response) override;
  grpc::ServerUnaryReactor* StoreAdd(
      grpc::CallbackServerContext* context,
      const tandem::v1::StoreAddRequest* request,
      tandem::v1::StoreAddResponse* response) override;
  grpc::ServerUnaryReactor* StoreCompareSet(
      grpc::CallbackServerContext* context,
      const tandem::v1::StoreCompareSetRequest* request,
      tandem::v1::StoreValueResponse* response) override;
  grpc::ServerUnaryReactor* StoreWait(
      grpc::CallbackServerContext* context,
      const tandem::v1::StoreWaitRequest* request,
      tandem::v1::StoreWaitResponse* response) override;
  grpc::ServerUnaryReactor* StoreDeleteKey(
      grpc::CallbackServerContext* context,
      const tandem::v1::StoreKeyRequest* request,
      tandem::v1::StoreDeleteKeyResponse* response) override;
  grpc::ServerUnaryReactor* StoreNumKeys(
      grpc::CallbackServerContext* context,
      const tandem::v1::StoreNumKeysRequest* request,
      tandem::v1::StoreNumKeysResponse* response) override;

 private:
  class HeldWait;

  // OK, or the refusal (counted and logged).
  absl::Status Authorize(const grpc::CallbackServerContext& context,
                         const char* rpc) const;
  void WaitLoop();
  void CancelWait(HeldWait* wait);

  const std::shared_ptr<weights::RendezvousKeys> keys_;
  const bool tls_enabled_;
  prometheus::Family<prometheus::Counter>* const auth_refused_;

  absl::Mutex mu_;
  // Held StoreWait calls, answered by WaitLoop.
  std::list<HeldWait*> waits_ ABSL_GUARDED_BY(mu_);
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;  // a key changed, or a new wait
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool exit_ ABSL_GUARDED_BY(mu_) = false;
  std::thread loop_;  // started with the first held wait
};

}  // namespace tandem::trainer
