#pragma once

// The two engine::WeightUpdateSources through which a rollout worker brings
// new weights into its decoder (common/model/): staged (a second copy,
// swapped in at a step boundary) and inplace (one copy, written while the
// engine is parked). LibTorch stays behind these classes: this header
// includes none of it.

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "common/weights/flat_weight_layout.h"
#include "common/weights/staging_weights.h"
#include "engine/engine_model.h"

namespace tandem::model {
class DecoderModel;
class ModelWeights;
}  // namespace tandem::model

namespace tandem::rollout {

// `received` converted to the device and dtype of `model`'s live weights
// (itself when they already match), so that staging it is a pointer swap.
absl::StatusOr<std::shared_ptr<model::ModelWeights>> MatchLiveWeights(
    const model::DecoderModel& model,
    std::shared_ptr<model::ModelWeights> received);

// Weights staged by a transport (any thread) and committed by the engine
// thread at a step boundary: Commit swaps pointers, so the pause does not
// depend on model size. Memory: the transport's two flat buffers (double
// buffer); the live and the staged ModelWeights view them (a third buffer
// only while the engine still holds a version the next one would
// overwrite, see StagingWeights::live_buffer()), unless the worker
// converts them to another dtype or device. For one copy, see
// InplaceWeightSource.
class StagedWeightSource : public engine::WeightUpdateSource {
 public:
  explicit StagedWeightSource(std::shared_ptr<model::DecoderModel> model);
  ~StagedWeightSource() override;

  // Thread-safe. Replaces any older staged version.
  void Stage(uint64_t version, std::shared_ptr<model::ModelWeights> weights);

  uint64_t ReadyVersion(uint64_t live) override;
  absl::StatusOr<uint64_t> Commit(uint64_t version) override;

 private:
  std::shared_ptr<model::DecoderModel> model_;
  absl::Mutex mu_;
  uint64_t staged_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<model::ModelWeights> staged_ ABSL_GUARDED_BY(mu_);
};

// The `inplace` update mode: the worker holds ONE copy of the weights. The
// model's live tensors are views (same dtype, shape and byte offset as the
// flat layout, 64-byte aligned) into the single buffer of a kInplace
// StagingWeights, and transports receive straight into that buffer. This
// source is the buffer's InplaceWriteGate:
//
//   receiver: Begin(v) -> BeginWrite(v): asks the engine to park and waits
//             until it is outside a step (at most the forward pass under
//             way); writes and verifies every bucket; Commit() ->
//             EndWrite(v): the engine resumes and its tokens carry v.
//   engine:   ReadyVersion() is non-zero while a writer holds the buffer or
//             the buffer is invalid; Commit() then blocks (the pause) until
//             a verified version is in place, and returns it.
//
// A version that fails verification (or a transfer that breaks after the
// first byte) leaves the buffer invalid: the engine stays parked and never
// generates with it, until the receiver commits a verified version (the
// subscriber pulls a full copy of the latest at once). With one copy there
// is nothing to fall back to.
//
// Thread-safety: the engine thread calls the WeightUpdateSource methods,
// one receiving thread the gate methods (through StagingWeights); other
// methods from any thread.
class InplaceWeightSource : public engine::WeightUpdateSource,
                            public weights::InplaceWriteGate {
 public:
  // Copies `model`'s live weights into a new flat buffer (the layout of
  // weights::LayoutForModel with `layout`) and makes the model's weights
  // views of it; the original tensors are released (unless someone else
  // holds them). `live_version` is the version of those weights.
  static absl::StatusOr<std::unique_ptr<InplaceWeightSource>> Create(
      std::shared_ptr<model::DecoderModel> model, uint64_t live_version,
      const weights::LayoutOptions& layout = {});
  ~InplaceWeightSource() override;

  // The buffer the receiver writes into. The model's tensors share its
  // ownership, so it lives as long as any of them.
  const std::shared_ptr<weights::StagingWeights>& staging() const {
    return staging_;
  }

  // Ends every wait for good: a parked engine's Commit() returns Cancelled,
  // and BeginWrite() no longer waits for the engine (it fails if the engine
  // is inside a step). For shutdown; idempotent.
  void Shutdown();

  struct Stats {
    uint64_t writes = 0;               // versions whose writing began
    uint64_t invalidations = 0;        // writes that ended without a version
    double max_park_wait_seconds = 0;  // longest wait for the engine
    double total_park_wait_seconds = 0;
  };
  Stats stats() const;

  // Whether the engine waits now in Commit() for a write to end (parked).
  // Lets a test see the park without sleeping for it.
  bool ParkedForTest() const;

  // WeightUpdateSource (engine thread).
  uint64_t ReadyVersion(uint64_t live) override;
  absl::StatusOr<uint64_t> Commit(uint64_t version) override;
  void StepDone() override;

  // weights::InplaceWriteGate (receiving thread).
  absl::Status BeginWrite(uint64_t version) override;
  void EndWrite(std::optional<uint64_t> live) override;

 private:
  InplaceWeightSource(std::shared_ptr<model::DecoderModel> model,
                      std::shared_ptr<weights::StagingWeights> staging,
                      uint64_t live_version);

  const std::shared_ptr<model::DecoderModel> model_;
  const std::shared_ptr<weights::StagingWeights> staging_;

  mutable absl::Mutex mu_;
  // The engine may be reading the weights (from a ReadyVersion() that
  // returned 0, or a Commit() that returned, until StepDone()).
  bool engine_in_step_ ABSL_GUARDED_BY(mu_) = false;
  // A receiver holds the buffer (BeginWrite .. EndWrite).
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // The buffer holds verified weights of live_version_.
  bool valid_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t live_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t writing_version_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool parked_ ABSL_GUARDED_BY(mu_) = false;  // the engine waits in Commit
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::rollout
