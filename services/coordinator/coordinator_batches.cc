// The coordinator's training-batch RPCs, the trainer's side of the ready
// queue: PullTrainingBatch (a long poll parked until a group is ready or its
// wait ends), CommitTrainingBatch and ReleaseTrainingBatch. Part of the
// Coordinator class (coordinator.h).

#include <algorithm>
#include <boost/asio/post.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/request_limits.h"
#include "services/coordinator/rpc_replies.h"

namespace tandem::coordinator {
namespace {

auto Log() { return ComponentLogger("coordinator"); }

using internal::Draining;
using internal::Finish;
using internal::Invalid;

}  // namespace

bool Coordinator::TryPull(const tandem::v1::PullTrainingBatchRequest& request,
                          tandem::v1::PullTrainingBatchResponse* response,
                          uint32_t* dropped) {
  tandem::v1::PullTrainingBatchResponse attempt =
      ledger_->Pull(request, clock_->Now());
  *dropped += attempt.dropped_stale_groups();
  if (attempt.batch_id().empty()) return false;
  *response = std::move(attempt);
  response->set_dropped_stale_groups(*dropped);
  return true;
}

grpc::ServerUnaryReactor* Coordinator::PullTrainingBatch(
    grpc::CallbackServerContext* context,
    const tandem::v1::PullTrainingBatchRequest* request,
    tandem::v1::PullTrainingBatchResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kPullTrainingBatch, *context,
                request->member_id(), *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Handing out a batch syncs the journal: off the reactor.
  const absl::Time caller_deadline = absl::FromChrono(context->deadline());
  boost::asio::post(
      *sync_pool_, [this, reactor, request, response, caller_deadline] {
        uint32_t dropped = 0;
        if (TryPull(*request, response, &dropped) || request->wait_ms() <= 0) {
          response->set_dropped_stale_groups(dropped);
          reactor->Finish(grpc::Status::OK);
          return;
        }
        absl::MutexLock lock(&pulls_mu_);
        if (pulls_closed_) {
          response->set_dropped_stale_groups(dropped);
          reactor->Finish(grpc::Status::OK);
          return;
        }
        const absl::Duration wait =
            std::min(absl::Milliseconds(request->wait_ms()), absl::Minutes(10));
        // Answer (empty) before the caller's own deadline runs out.
        const absl::Time deadline = std::min(
            absl::Now() + wait, caller_deadline - absl::Milliseconds(50));
        parked_pulls_.push_back(ParkedPull{reactor, request, response,
                                           deadline, dropped, absl::Now()});
      });
  return reactor;
}

void Coordinator::PostServeParkedPulls() {
  // On the thread that parks pulls: a group that becomes ready after a
  // pull found none is served by this task, queued behind the one parking
  // that pull (no wait for the next maintenance tick); and handing out a
  // batch syncs the journal there, not on the scoring or maintenance
  // thread.
  boost::asio::post(*sync_pool_,
                    [this] { ServeParkedPulls(/*finish_all=*/false); });
}

void Coordinator::ServeParkedPulls(bool finish_all) {
  absl::MutexLock lock(&pulls_mu_);
  if (finish_all) pulls_closed_ = true;
  const absl::Time now = absl::Now();
  std::erase_if(parked_pulls_, [&](ParkedPull& pull) {
    const bool served = TryPull(*pull.request, pull.response, &pull.dropped);
    if (!served && !finish_all && now < pull.deadline) return false;
    metrics_.AddTrainerWait(now - pull.parked_at);
    pull.response->set_dropped_stale_groups(pull.dropped);
    pull.reactor->Finish(grpc::Status::OK);
    return true;
  });
}

grpc::ServerUnaryReactor* Coordinator::CommitTrainingBatch(
    grpc::CallbackServerContext* context,
    const tandem::v1::CommitTrainingBatchRequest* request,
    tandem::v1::CommitTrainingBatchResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kCommitTrainingBatch, *context,
                request->member_id(), *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  if (request->batch_id().empty()) {
    return Finish(context, Invalid("batch_id is empty"));
  }
  // The commit syncs the journal.
  return FinishOffReactor(context, [this, request, response] {
    absl::StatusOr<CommitResult> result =
        ledger_->Commit(request->batch_id(), request->policy_version());
    if (!result.ok()) return rpc::ToGrpcStatus(result.status());
    for (uint64_t staleness : result->staleness) {
      metrics_.ObserveTrainedStaleness(staleness);
    }
    response->set_groups_committed(result->groups);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* Coordinator::ReleaseTrainingBatch(
    grpc::CallbackServerContext* context,
    const tandem::v1::ReleaseTrainingBatchRequest* request,
    tandem::v1::ReleaseTrainingBatchResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kReleaseTrainingBatch, *context,
                request->member_id(), *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  if (request->batch_id().empty()) {
    return Finish(context, Invalid("batch_id is empty"));
  }
  // Serving the waiting pulls syncs the journal.
  return FinishOffReactor(
      context,
      [this, request, response] {
        absl::StatusOr<uint32_t> released =
            ledger_->ReleaseBatch(request->member_id(), request->batch_id());
        if (!released.ok()) {
          Log()->warn("ReleaseTrainingBatch from {}: {}", request->member_id(),
                      released.status().ToString());
          return rpc::ToGrpcStatus(released.status());
        }
        Log()->warn(
            "training batch {} ({} groups) handed back by {}: {}",
            request->batch_id(), *released, request->member_id(),
            request->reason().empty() ? "no reason given" : request->reason());
        response->set_groups_released(*released);
        return grpc::Status::OK;
      },
      // Its groups are ready again.
      [this] { ServeParkedPulls(/*finish_all=*/false); });
}

grpc::ServerUnaryReactor* Coordinator::FinishOffReactor(
    grpc::CallbackServerContext* context, std::function<grpc::Status()> work,
    std::function<void()> then) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  boost::asio::post(*sync_pool_, [reactor, work = std::move(work),
                                  then = std::move(then)] {
    reactor->Finish(work());
    if (then) then();
  });
  return reactor;
}

}  // namespace tandem::coordinator
