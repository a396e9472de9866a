#pragma once

// An in-process weight transport: a bus that keeps the most recent
// published versions in memory and hands them to any number of receivers,
// each in version order. For tests and for running the rollout engine
// before the network transports exist; it copies payloads, so it also
// serves as the reference behaviour for them.
//
// Thread-safe: senders and receivers may live on different threads. The
// bus must outlive its senders and receivers.

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/weights/weight_transport.h"

namespace tandem::weights {

class InProcessWeightBus {
 public:
  // Keeps the last `retain` versions (>= 1) for late receivers.
  explicit InProcessWeightBus(size_t retain = 8);

  std::unique_ptr<WeightSender> NewSender();
  std::unique_ptr<WeightReceiver> NewReceiver();

  // The next payload any receiver takes gets byte `offset` (mod its size)
  // flipped in that receiver's copy, to test corruption handling.
  void CorruptNextDeliveryForTest(uint64_t offset);

  struct Published {
    v1::WeightManifest manifest;
    std::shared_ptr<const std::vector<uint8_t>> payload;
  };

 private:
  friend class InProcessSender;
  friend class InProcessReceiver;

  const size_t retain_;
  absl::Mutex mu_;
  std::deque<Published> versions_ ABSL_GUARDED_BY(mu_);  // increasing
  bool corrupt_next_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t corrupt_offset_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::weights
