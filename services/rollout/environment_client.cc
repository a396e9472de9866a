#include "services/rollout/environment_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_client.h"

namespace tandem::rollout {

EnvironmentClient::EnvironmentClient(std::shared_ptr<grpc::Channel> channel,
                                     std::string address,
                                     EnvironmentClientOptions options)
    : stub_(tandem::v1::Environment::NewStub(std::move(channel))),
      address_(std::move(address)),
      options_(options) {}

EnvironmentClient::~EnvironmentClient() { Stop(); }

uint64_t EnvironmentClient::Begin(std::unique_ptr<Call> call,
                                  absl::Duration timeout) {
  call->started = absl::Now();
  call->context.set_deadline(absl::ToChronoTime(call->started + timeout));
  absl::MutexLock lock(&mu_);
  if (stopped_) {
    EnvironmentReply reply;
    reply.kind = call->kind;
    reply.key = std::move(call->key);
    reply.status = absl::UnavailableError(absl::StrCat(
        call->what, " at ", address_, ": the environment client is stopped"));
    completed_.push_back(std::move(reply));
    return 0;
  }
  const uint64_t id = next_id_++;
  calls_[id] = std::move(call);
  return id;
}

void EnvironmentClient::Open(std::string key,
                             tandem::v1::OpenEpisodeRequest request) {
  auto call = std::make_unique<Call>();
  call->kind = EnvironmentReply::Kind::kOpen;
  call->key = std::move(key);
  call->what = absl::StrCat("OpenEpisode of environment \"",
                            request.environment(), "\"");
  call->open_request = std::move(request);
  Call* raw = call.get();
  const uint64_t id = Begin(std::move(call), options_.open_timeout);
  if (id == 0) return;
  // The call stays in calls_ until Done erases it, so `raw` outlives the RPC.
  stub_->async()->OpenEpisode(
      &raw->context, &raw->open_request, &raw->open_response,
      [this, id](grpc::Status status) { Done(id, status); });
}

void EnvironmentClient::Step(std::string key, tandem::v1::StepRequest request) {
  auto call = std::make_unique<Call>();
  call->kind = EnvironmentReply::Kind::kStep;
  call->key = std::move(key);
  call->what = absl::StrCat("Step of episode ", request.episode_id());
  call->step_request = std::move(request);
  Call* raw = call.get();
  const uint64_t id = Begin(std::move(call), options_.step_timeout);
  if (id == 0) return;
  stub_->async()->Step(&raw->context, &raw->step_request, &raw->step_response,
                       [this, id](grpc::Status status) { Done(id, status); });
}

void EnvironmentClient::Close(std::string key, std::string episode_id) {
  auto call = std::make_unique<Call>();
  call->kind = EnvironmentReply::Kind::kClose;
  call->key = std::move(key);
  call->what = absl::StrCat("CloseEpisode of episode ", episode_id);
  call->close_request.set_episode_id(std::move(episode_id));
  Call* raw = call.get();
  const uint64_t id = Begin(std::move(call), options_.close_timeout);
  if (id == 0) return;
  stub_->async()->CloseEpisode(
      &raw->context, &raw->close_request, &raw->close_response,
      [this, id](grpc::Status status) { Done(id, status); });
}

void EnvironmentClient::Done(uint64_t id, const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return;  // cannot happen: each id completes once
  Call& call = *it->second;
  EnvironmentReply reply;
  reply.kind = call.kind;
  reply.key = std::move(call.key);
  reply.seconds = absl::ToDoubleSeconds(absl::Now() - call.started);
  if (status.ok()) {
    reply.open = std::move(call.open_response);
    reply.step = std::move(call.step_response);
  } else {
    const absl::Status converted = rpc::ToAbslStatus(status);
    reply.status = absl::Status(
        converted.code(),
        absl::StrCat(
            call.what, " at ", address_, ": ", converted.message(),
            status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                ? absl::StrCat(
                      " (no answer after ",
                      absl::FormatDuration(absl::Seconds(reply.seconds)), ")")
                : ""));
  }
  completed_.push_back(std::move(reply));
  calls_.erase(it);
}

std::vector<EnvironmentReply> EnvironmentClient::TakeCompleted() {
  absl::MutexLock lock(&mu_);
  std::vector<EnvironmentReply> out;
  out.swap(completed_);
  return out;
}

bool EnvironmentClient::WaitForReply(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto has_reply = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !completed_.empty();
  };
  return mu_.AwaitWithTimeout(absl::Condition(&has_reply), timeout);
}

int32_t EnvironmentClient::in_flight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(calls_.size());
}

void EnvironmentClient::Stop() {
  std::vector<std::shared_ptr<Call>> running;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (auto& [id, call] : calls_) running.push_back(call);
  }
  // Outside mu_: a cancelled call's callback takes mu_.
  for (const std::shared_ptr<Call>& call : running) call->context.TryCancel();
  running.clear();
  absl::MutexLock lock(&mu_);
  // Each callback erases its call; they run on gRPC's threads.
  auto all_done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return calls_.empty();
  };
  mu_.Await(absl::Condition(&all_done));
}

}  // namespace tandem::rollout
