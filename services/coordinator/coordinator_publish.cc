// The coordinator's side of the publish protocol (group_ledger.h): the
// trainer's batch-keyed PublishPolicyVersion and ResumeTraining. Part of
// the Coordinator class (coordinator.h).

#include <algorithm>
#include <boost/asio/post.hpp>
#include <csignal>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/rpc/grpc_client.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/rpc_replies.h"

namespace tandem::coordinator {
namespace {

auto Log() { return ComponentLogger("coordinator"); }

using internal::Draining;
using internal::Finish;
using internal::Invalid;

// Fault injection for tests: with TANDEM_TEST_KILL_COORDINATOR_AFTER_PUBLISH
// set to a version, the coordinator SIGKILLs itself once that version is
// recorded (journal synced), before the trainer gets its answer.
void KillSelfAfterPublishForTest(uint64_t version) {
  static const char* const kVersion =
      std::getenv("TANDEM_TEST_KILL_COORDINATOR_AFTER_PUBLISH");
  if (kVersion == nullptr || std::to_string(version) != kVersion) return;
  Log()->warn("fault injection: killed after recording version {}", version);
  std::raise(SIGKILL);
}

}  // namespace

grpc::ServerUnaryReactor* Coordinator::PublishPolicyVersion(
    grpc::CallbackServerContext* context,
    const tandem::v1::PublishPolicyVersionRequest* request,
    tandem::v1::PublishPolicyVersionResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kPublishPolicyVersion, *context,
                request->member_id(), *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  if (!request->has_manifest()) {
    return Finish(context, Invalid("manifest is required"));
  }
  // Publishing syncs the journal.
  return FinishOffReactor(context, [this, request, response] {
    const uint64_t version = request->manifest().policy_version();
    absl::StatusOr<PublishResult> published = ledger_->PublishTrainedVersion(
        request->manifest(), request->weight_server_address(),
        request->batch_id());
    if (published.ok() && published->duplicate) {
      // The trainer retried a publish whose answer it never got.
      *response->mutable_group() = epochs_->Current();
      response->set_membership_epoch(response->group().epoch());
      Log()->info(
          "policy version {} (batch {}) published again by {}: already "
          "recorded, acknowledged",
          version, request->batch_id(), request->member_id());
      return grpc::Status::OK;
    }
    absl::Status status = published.status();
    if (status.ok()) {
      for (uint64_t staleness : published->commit.staleness) {
        metrics_.ObserveTrainedStaleness(staleness);
      }
      metrics_.policy_version().Set(static_cast<double>(version));
      const uint64_t before = epochs_->Current().epoch();
      tandem::v1::BroadcastGroup group =
          epochs_->OnPublish(version, clock_->Now());
      if (group.epoch() != before) {
        Log()->info(
            "weight broadcast epoch {} from version {}: {} receivers ({})",
            group.epoch(), version, std::max(0, group.member_ids_size() - 1),
            absl::StrJoin(group.member_ids(), ", "));
      }
      // The epoch first: it says who receives the version announced next.
      if (group.epoch() != before) AnnounceEpoch(group);
      tandem::v1::ClusterEvent event;
      *event.mutable_policy_version()->mutable_manifest() = request->manifest();
      event.mutable_policy_version()->set_weight_server_address(
          request->weight_server_address());
      watchers_->Publish(event);
      response->set_membership_epoch(group.epoch());
      *response->mutable_group() = std::move(group);
      Log()->info("policy version {} published by {}{}", version,
                  request->member_id(),
                  request->batch_id().empty()
                      ? std::string()
                      : absl::StrCat(" (batch ", request->batch_id(), ", ",
                                     published->commit.groups, " groups)"));
      KillSelfAfterPublishForTest(version);
    } else {
      Log()->warn("refused policy version {} from {}: {}", version,
                  request->member_id(), status.ToString());
    }
    return rpc::ToGrpcStatus(status);
  });
}

grpc::ServerUnaryReactor* Coordinator::ResumeTraining(
    grpc::CallbackServerContext* context,
    const tandem::v1::ResumeTrainingRequest* request,
    tandem::v1::ResumeTrainingResponse* response) {
  if (grpc::Status admitted =
          Admit(CoordinatorRpc::kResumeTraining, *context, request->member_id(),
                *request);
      !admitted.ok()) {
    return Finish(context, admitted);
  }
  if (draining_) return Finish(context, Draining());
  if (!members_.IsLive(request->member_id())) {
    return Finish(context,
                  grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               absl::StrCat("member '", request->member_id(),
                                            "' is not registered or was "
                                            "declared dead; register again")));
  }
  // Resuming syncs the journal.
  return FinishOffReactor(context, [this, request, response] {
    absl::StatusOr<ResumeResult> result =
        ledger_->Resume(request->member_id(), request->policy_version());
    if (!result.ok()) return rpc::ToGrpcStatus(result.status());
    response->set_policy_version(result->policy_version);
    response->set_groups_requeued(result->groups_requeued);
    response->set_groups_lost(result->groups_lost);
    response->set_batches_released(result->batches_released);
    if (request->policy_version() < result->policy_version) {
      Log()->warn(
          "trainer {} resumes from policy version {}, the latest is {}: the "
          "groups trained since are gone from its weights; {} queued again, "
          "{} lost (too stale to train again){}; {} batches of earlier "
          "trainers released",
          request->member_id(), request->policy_version(),
          result->policy_version, result->groups_requeued, result->groups_lost,
          result->complete ? "" : " (at least: older versions are forgotten)",
          result->batches_released);
    } else {
      Log()->info(
          "trainer {} resumes at policy version {} (latest {}); {} batches "
          "of earlier trainers released",
          request->member_id(), request->policy_version(),
          result->policy_version, result->batches_released);
    }
    UpdateWorkMetrics();
    return grpc::Status::OK;
  });
}


}  // namespace tandem::coordinator
