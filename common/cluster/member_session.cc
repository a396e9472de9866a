#include "common/cluster/member_session.h"

#include <unistd.h>

#include <algorithm>

#include "common/base/logging.h"
#include "common/cluster/member_names.h"
#include "common/rpc/grpc_client.h"

namespace tandem::cluster {
namespace {

std::string Hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

MemberSession::MemberSession(MemberSessionOptions options,
                             HeartbeatFiller filler)
    : options_(std::move(options)),
      filler_(std::move(filler)),
      client_(ConnectCoordinator(options_.coordinator_address, options_.tls)) {}

MemberSession::~MemberSession() { Stop(false, "destroyed"); }

void MemberSession::Start() {
  thread_ = std::thread([this] { Run(); });
}

std::string MemberSession::member_id() const {
  absl::MutexLock lock(&mu_);
  return member_id_;
}

bool MemberSession::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

uint64_t MemberSession::cluster_policy_version() const {
  absl::MutexLock lock(&mu_);
  return cluster_policy_version_;
}

bool MemberSession::TryRegister() {
  tandem::v1::RegisterRequest request;
  request.set_role(options_.role);
  request.set_grpc_address(options_.grpc_address);
  request.set_metrics_address(options_.metrics_address);
  request.set_hostname(Hostname());
  request.set_pid(getpid());
  for (const auto& [k, v] : options_.capabilities) {
    (*request.mutable_capabilities())[k] = v;
  }
  {
    absl::MutexLock lock(&mu_);
    request.set_previous_member_id(previous_member_id_);
  }
  tandem::v1::RegisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  grpc::Status status = client_->Register(&context, request, &response);
  if (!status.ok()) return false;
  {
    absl::MutexLock lock(&mu_);
    heartbeat_interval_ = absl::Milliseconds(
        std::max<int64_t>(50, response.heartbeat_interval_ms()));
  }
  TakeDataPlaneSecret(response.data_plane());
  absl::MutexLock lock(&mu_);
  member_id_ = response.member_id();
  previous_member_id_ = response.member_id();
  registered_ = true;
  cluster_policy_version_ = response.policy_version();
  ComponentLogger(RoleName(options_.role))
      ->info("registered with coordinator {} as {} (heartbeat every {} ms)",
             options_.coordinator_address, member_id_,
             response.heartbeat_interval_ms());
  return true;
}

void MemberSession::Heartbeat() {
  tandem::v1::HeartbeatRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_member_id(member_id_);
  }
  request.set_state(tandem::v1::MEMBER_STATE_ALIVE);
  if (filler_) filler_(&request);
  tandem::v1::HeartbeatResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  grpc::Status status = client_->Heartbeat(&context, request, &response);
  if (status.ok()) TakeDataPlaneSecret(response.data_plane());
  absl::MutexLock lock(&mu_);
  if (status.ok()) {
    cluster_policy_version_ = response.policy_version();
    return;
  }
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
      status.error_code() == grpc::StatusCode::NOT_FOUND) {
    ComponentLogger(RoleName(options_.role))
        ->warn("coordinator no longer knows {} ({}); registering again",
               member_id_, status.error_message());
    registered_ = false;
  }
}

void MemberSession::TakeDataPlaneSecret(
    const tandem::v1::DataPlaneSecret& secret) {
  if (secret.epoch() == 0 || secret.epoch() == data_plane_epoch_) return;
  data_plane_epoch_ = secret.epoch();
  absl::Duration interval;
  {
    absl::MutexLock lock(&mu_);
    interval = heartbeat_interval_;
  }
  if (options_.on_data_plane_secret) {
    options_.on_data_plane_secret(secret, interval);
  }
}

void MemberSession::Run() {
  absl::Duration backoff = absl::Milliseconds(50);
  bool logged_unreachable = false;
  while (true) {
    absl::Duration wait;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    if (!registered()) {
      if (TryRegister()) {
        backoff = absl::Milliseconds(50);
        logged_unreachable = false;
        continue;
      }
      if (!logged_unreachable) {
        ComponentLogger(RoleName(options_.role))
            ->warn("coordinator {} unreachable; retrying",
                   options_.coordinator_address);
        logged_unreachable = true;
      }
      wait = backoff;
      backoff = std::min(backoff * 2, options_.max_backoff);
    } else {
      Heartbeat();
      absl::MutexLock lock(&mu_);
      wait = heartbeat_interval_;
    }
    absl::MutexLock lock(&mu_);
    auto stop_requested = [this]()
                              ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
    options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&stop_requested),
                                     wait);
  }
}

void MemberSession::Stop(bool deregister, const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    if (!registered_ || !deregister) return;
    id = member_id_;
    registered_ = false;
  }
  tandem::v1::DeregisterRequest request;
  request.set_member_id(id);
  request.set_reason(reason);
  tandem::v1::DeregisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  grpc::Status status = client_->Deregister(&context, request, &response);
  if (!status.ok()) {
    ComponentLogger(RoleName(options_.role))
        ->warn("deregister of {} failed: {}", id, status.error_message());
  }
}

}  // namespace tandem::cluster
