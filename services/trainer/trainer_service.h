#pragma once

// The trainer's tandem.v1.Trainer gRPC service, apart from the training
// loop it reports on:
//   GetStatus       answers from the TrainerStatusBoard, which the training
//                   thread keeps current;
//   SaveCheckpoint  queues the call in a CheckpointRequestQueue; the
//                   training thread owns the policy, so it writes the
//                   checkpoint between two steps and finishes the call.
// Reactors never block: both handlers only take a short lock.

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace tandem::trainer {

// The trainer's status message, written by the training thread and read by
// RPC threads. Thread-safe.
class TrainerStatusBoard {
 public:
  tandem::v1::TrainerStatus Snapshot() const;
  // Runs `update` on the status under the board's lock.
  void Update(absl::FunctionRef<void(tandem::v1::TrainerStatus&)> update);

 private:
  mutable absl::Mutex mu_;
  tandem::v1::TrainerStatus status_ ABSL_GUARDED_BY(mu_);
};

// SaveCheckpoint calls waiting for the training thread. Thread-safe.
class CheckpointRequestQueue {
 public:
  struct Request {
    grpc::ServerUnaryReactor* reactor;
    tandem::v1::SaveCheckpointResponse* response;
  };
  // Queues `request` and returns true while the queue accepts calls (from
  // the training thread's start until the trainer stops); false otherwise,
  // and the caller answers the call itself.
  bool Add(Request request);
  void SetAccepting(bool accepting);
  // Every queued call, for the training thread to answer.
  std::vector<Request> TakeAll();

 private:
  absl::Mutex mu_;
  std::vector<Request> requests_ ABSL_GUARDED_BY(mu_);
  bool accepting_ ABSL_GUARDED_BY(mu_) = false;
};

class TrainerService : public tandem::v1::Trainer::CallbackService {
 public:
  // `status` and `checkpoints` must outlive the service. `training_enabled`
  // says why a SaveCheckpoint that is not accepted is refused (stopping, or
  // training.enabled false); `member_id` gives the trainer's current
  // member id for GetStatus. With `tls_enabled` (tls.mode mtls),
  // SaveCheckpoint needs a certificate of the admin role; its refusals are
  // counted in `auth_refused` ({reason}: unauthenticated, wrong_role),
  // which must outlive the service. GetStatus is open to every role.
  TrainerService(const TrainerStatusBoard* status,
                 CheckpointRequestQueue* checkpoints, bool training_enabled,
                 std::function<std::string()> member_id, bool tls_enabled,
                 prometheus::Family<prometheus::Counter>* auth_refused);

  grpc::ServerUnaryReactor* GetStatus(
      grpc::CallbackServerContext* context,
      const tandem::v1::GetTrainerStatusRequest* request,
      tandem::v1::TrainerStatus* response) override;
  // Answered by the training thread with the checkpoint's path;
  // FAILED_PRECONDITION when training is disabled, UNAVAILABLE while the
  // trainer stops.
  grpc::ServerUnaryReactor* SaveCheckpoint(
      grpc::CallbackServerContext* context,
      const tandem::v1::SaveCheckpointRequest* request,
      tandem::v1::SaveCheckpointResponse* response) override;

 private:
  const TrainerStatusBoard* const status_;
  CheckpointRequestQueue* const checkpoints_;
  const bool training_enabled_;
  const std::function<std::string()> member_id_;
  const bool tls_enabled_;
  prometheus::Family<prometheus::Counter>* const auth_refused_;
};

}  // namespace tandem::trainer
