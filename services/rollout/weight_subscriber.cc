#include "services/rollout/weight_subscriber.h"

#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/model_weights.h"
#include "common/rpc/grpc_client.h"
#include "common/weights/grpc_pull_receiver.h"
#include "common/weights/model_flattening.h"

namespace tandem::rollout {

absl::StatusOr<std::unique_ptr<WeightSubscriber>> WeightSubscriber::Create(
    std::shared_ptr<model::DecoderModel> model, StagedWeightSource* source,
    std::function<std::string()> weight_server_address, uint64_t live_version) {
  std::unique_ptr<WeightSubscriber> s(new WeightSubscriber());
  s->model_ = std::move(model);
  s->source_ = source;
  s->address_ = std::move(weight_server_address);
  s->received_version_ = live_version;
  ASSIGN_OR_RETURN(weights::FlatWeightLayout layout,
                   weights::LayoutForModel(*s->model_->weights()));
  ASSIGN_OR_RETURN(s->staging_,
                   weights::StagingWeights::Create(
                       std::move(layout), weights::StagingMode::kDoubleBuffer));
  return s;
}

WeightSubscriber::~WeightSubscriber() { Stop(); }

void WeightSubscriber::Start() {
  thread_ = std::thread([this] { Run(); });
}

void WeightSubscriber::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (receiver_ != nullptr) receiver_->Cancel();
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t WeightSubscriber::received_version() const {
  absl::MutexLock lock(&mu_);
  return received_version_;
}

uint64_t WeightSubscriber::versions_received() const {
  absl::MutexLock lock(&mu_);
  return versions_received_;
}

void WeightSubscriber::Run() {
  auto log = ComponentLogger("rollout");
  std::string address;
  std::unique_ptr<weights::GrpcPullReceiver> receiver;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
    }
    const std::string current = address_();
    if (current.empty()) {
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    if (current != address || receiver == nullptr) {
      address = current;
      receiver = std::make_unique<weights::GrpcPullReceiver>(
          rpc::MakeChannel(address), weights::PullOptions{});
      absl::MutexLock lock(&mu_);
      receiver_ = receiver.get();
      if (stop_) break;
    }
    absl::StatusOr<uint64_t> version =
        receiver->ReceiveNext(staging_.get(), absl::Now() + absl::Seconds(1));
    if (!version.ok()) {
      // DeadlineExceeded: nothing newer yet. Others: the trainer is away or
      // the payload was bad; either way, try again.
      if (version.status().code() != absl::StatusCode::kDeadlineExceeded &&
          version.status().code() != absl::StatusCode::kCancelled) {
        log->warn("weight pull from {} failed: {}", address,
                  version.status().ToString());
        absl::SleepFor(absl::Milliseconds(200));
      }
      continue;
    }
    absl::Status status = staging_->Commit().status();
    absl::StatusOr<std::shared_ptr<model::ModelWeights>> weights;
    if (status.ok()) {
      weights =
          weights::UnflattenModel(model_->weights()->config(),
                                  staging_->layout(), staging_->live().bytes);
      status = weights.status();
    }
    if (!status.ok()) {
      log->warn("policy version {} rejected: {}", *version, status.ToString());
      continue;
    }
    source_->Stage(*version, *std::move(weights));
    absl::MutexLock lock(&mu_);
    received_version_ = *version;
    ++versions_received_;
  }
  absl::MutexLock lock(&mu_);
  receiver_ = nullptr;
}

}  // namespace tandem::rollout
