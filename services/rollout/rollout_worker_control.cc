// The rollout worker's control plane: the RolloutControl RPCs (GetStatus,
// Pause, Resume, Drain and their state transitions), the status it reports
// in them and in heartbeats, and the answers to Drain calls waiting for the
// worker to drain. Kept apart from rollout_worker.cc, which is the worker's
// lifecycle and generation loop.

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"
#include "common/rpc/peer_identity.h"
#include "services/rollout/rollout_worker.h"

namespace tandem::rollout {
namespace {

auto Log() { return ComponentLogger("rollout"); }

}  // namespace

void RolloutWorker::FillHeartbeat(tandem::v1::HeartbeatRequest* request) {
  absl::MutexLock lock(&mu_);
  request->set_policy_version(snapshot_.policy_version);
  if (stopping_) request->set_state(tandem::v1::MEMBER_STATE_DRAINING);
  auto* load = request->mutable_load();
  load->set_running(static_cast<uint32_t>(snapshot_.running));
  load->set_waiting(static_cast<uint32_t>(snapshot_.waiting));
  load->set_kv_cache_usage(snapshot_.kv_blocks_total == 0
                               ? 0.0
                               : static_cast<double>(snapshot_.kv_blocks_used) /
                                     snapshot_.kv_blocks_total);
  load->set_tokens_total(snapshot_.generated_tokens);
  load->set_tokens_per_second(tokens_per_second_);
  load->set_last_pause_seconds(last_pause_seconds_);
}

void RolloutWorker::FillStatus(tandem::v1::RolloutStatus* status) {
  status->set_member_id(member_->session().member_id());
  status->set_prefetched_prompts(static_cast<uint32_t>(prefetcher_->depth()));
  absl::MutexLock lock(&mu_);
  status->set_state(state_);
  status->set_policy_version(snapshot_.policy_version);
  status->set_running_sequences(static_cast<uint32_t>(snapshot_.running));
  status->set_waiting_sequences(static_cast<uint32_t>(snapshot_.waiting));
  status->set_kv_blocks_used(static_cast<uint64_t>(snapshot_.kv_blocks_used));
  status->set_kv_blocks_total(static_cast<uint64_t>(snapshot_.kv_blocks_total));
  status->set_generated_tokens_total(snapshot_.generated_tokens);
  status->set_tokens_per_second(tokens_per_second_);
  status->set_last_update_pause_seconds(last_pause_seconds_);
  if (loaded_ && subscriber_) {
    const WeightSyncStatus sync = subscriber_->sync_status();
    status->set_received_policy_version(sync.received_version);
    status->set_weights_digest(sync.digest);
    status->set_weight_sync_transport(sync.transport);
    status->set_broadcast_epoch(sync.epoch);
  }
}

grpc::Status RolloutWorker::AuthorizeAdmin(
    const grpc::CallbackServerContext& context, const char* method) {
  absl::Status status = rpc::AuthorizePeer(
      context, config_.server.tls.enabled(), method, {rpc::PeerRole::kAdmin});
  if (status.ok()) return grpc::Status::OK;
  const char* reason = rpc::AuthRefusalReason(status);
  metrics_.auth_refused.Add({{"reason", reason}}).Increment();
  Log()->warn("refused {} from {} ({}): {}", method, context.peer(), reason,
              std::string(status.message()));
  return rpc::ToGrpcStatus(status);
}

grpc::Status RolloutWorker::Transition(tandem::v1::RolloutState target) {
  if (stopping_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "rollout worker is shutting down");
  }
  {
    absl::MutexLock lock(&mu_);
    if (state_ == tandem::v1::ROLLOUT_STATE_LOADING) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "rollout worker is loading its model");
    }
    if (state_ != target && !(target == tandem::v1::ROLLOUT_STATE_DRAINING &&
                              state_ == tandem::v1::ROLLOUT_STATE_DRAINED)) {
      Log()->info("state {} -> {}", tandem::v1::RolloutState_Name(state_),
                  tandem::v1::RolloutState_Name(target));
      state_ = target;
    }
    metrics_.paused.Set(state_ == tandem::v1::ROLLOUT_STATE_RUNNING ? 0 : 1);
  }
  // Draining stops leasing and gives back prompts not yet started; running
  // leases again after a drain.
  prefetcher_->SetLeasing(target == tandem::v1::ROLLOUT_STATE_RUNNING);
  if (target == tandem::v1::ROLLOUT_STATE_DRAINING) {
    prefetcher_->ReturnQueued("drain");
  } else {
    AnswerDrainWaiters(/*all=*/true);
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* RolloutWorker::GetStatus(
    grpc::CallbackServerContext* context,
    const tandem::v1::GetRolloutStatusRequest* request,
    tandem::v1::RolloutStatus* response) {
  FillStatus(response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* RolloutWorker::Pause(
    grpc::CallbackServerContext* context,
    const tandem::v1::PauseRequest* request,
    tandem::v1::RolloutStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = AuthorizeAdmin(*context, "Pause"); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  grpc::Status status = Transition(tandem::v1::ROLLOUT_STATE_PAUSED);
  if (status.ok()) FillStatus(response);
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* RolloutWorker::Resume(
    grpc::CallbackServerContext* context,
    const tandem::v1::ResumeRequest* request,
    tandem::v1::RolloutStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = AuthorizeAdmin(*context, "Resume"); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  grpc::Status status = Transition(tandem::v1::ROLLOUT_STATE_RUNNING);
  if (status.ok()) FillStatus(response);
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* RolloutWorker::Drain(
    grpc::CallbackServerContext* context,
    const tandem::v1::DrainRequest* request,
    tandem::v1::RolloutStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = AuthorizeAdmin(*context, "Drain"); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  // The reason goes to the log: bounded like the coordinator's reasons.
  constexpr size_t kMaxReasonBytes = 4096;
  if (request->reason().size() > kMaxReasonBytes) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("DrainRequest.reason is ", request->reason().size(),
                     " bytes; the limit is ", kMaxReasonBytes)));
    return reactor;
  }
  if (grpc::Status status = Transition(tandem::v1::ROLLOUT_STATE_DRAINING);
      !status.ok()) {
    reactor->Finish(status);
    return reactor;
  }
  Log()->info("drain requested{}{}", request->reason().empty() ? "" : ": ",
              request->reason());
  // Answer a little before the caller's deadline, so that it gets the
  // status (DRAINING) rather than DEADLINE_EXCEEDED. No deadline: wait until
  // drained.
  const absl::Time now = absl::Now();
  absl::Time answer_by = absl::InfiniteFuture();
  if (context->deadline() <
      std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    const absl::Time deadline = absl::FromChrono(context->deadline());
    answer_by =
        deadline - std::min(absl::Milliseconds(200), (deadline - now) / 10);
  }
  bool answer_now = false;
  {
    absl::MutexLock lock(&mu_);
    answer_now = state_ != tandem::v1::ROLLOUT_STATE_DRAINING ||
                 answer_by <= now || stopping_;
    if (!answer_now) drain_waiters_.push_back({reactor, response, answer_by});
  }
  if (answer_now) {
    FillStatus(response);
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

void RolloutWorker::AnswerDrainWaiters(bool all) {
  std::vector<DrainWaiter> done;
  {
    absl::MutexLock lock(&mu_);
    if (drain_waiters_.empty()) return;
    const absl::Time now = absl::Now();
    const bool draining = state_ == tandem::v1::ROLLOUT_STATE_DRAINING;
    auto keep = drain_waiters_.begin();
    for (DrainWaiter& waiter : drain_waiters_) {
      if (all || !draining || now >= waiter.answer_by) {
        done.push_back(waiter);
      } else {
        *keep++ = waiter;
      }
    }
    drain_waiters_.erase(keep, drain_waiters_.end());
  }
  for (DrainWaiter& waiter : done) {
    FillStatus(waiter.response);
    waiter.reactor->Finish(grpc::Status::OK);
  }
}

}  // namespace tandem::rollout
