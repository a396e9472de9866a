#pragma once

// WeightSubscriber keeps a rollout worker on the newest published policy:
// a background thread pulls each new version from the trainer's
// WeightServer (the catch-up path: chunked, CRC-checked, resumable) into a
// flat staging buffer, verifies and rebuilds it as ModelWeights, and stages
// it in the StagedWeightSource; the engine then commits it at its next step
// boundary (a pointer swap), so generation never waits for the transfer.
// Thread-safe; Stop() joins.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/weights/staging_weights.h"
#include "services/rollout/torch_engine_model.h"

namespace tandem::weights {
class GrpcPullReceiver;
}  // namespace tandem::weights

namespace tandem::rollout {

class WeightSubscriber {
 public:
  // `weight_server_address` returns the trainer's gRPC address ("" while
  // unknown). `model` is the worker's decoder (its live weights define the
  // layout every version must have).
  static absl::StatusOr<std::unique_ptr<WeightSubscriber>> Create(
      std::shared_ptr<model::DecoderModel> model, StagedWeightSource* source,
      std::function<std::string()> weight_server_address,
      uint64_t live_version);
  ~WeightSubscriber();

  void Start();
  void Stop();

  uint64_t received_version() const;
  uint64_t versions_received() const;

 private:
  WeightSubscriber() = default;
  void Run();

  std::shared_ptr<model::DecoderModel> model_;
  StagedWeightSource* source_ = nullptr;
  std::function<std::string()> address_;
  std::unique_ptr<weights::StagingWeights> staging_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  weights::GrpcPullReceiver* receiver_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t received_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t versions_received_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::rollout
