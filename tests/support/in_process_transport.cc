#include "tests/support/in_process_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::weights {

class InProcessSender : public WeightSender {
 public:
  explicit InProcessSender(InProcessWeightBus* bus) : bus_(bus) {}

  absl::Status Publish(const v1::WeightManifest& manifest,
                       absl::Span<const uint8_t> payload,
                       absl::Time /*deadline*/) override {
    auto bytes = std::make_shared<const std::vector<uint8_t>>(payload.begin(),
                                                              payload.end());
    absl::MutexLock lock(&bus_->mu_);
    if (!bus_->versions_.empty() &&
        bus_->versions_.back().manifest.policy_version() >=
            manifest.policy_version()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "weights v", manifest.policy_version(), " published after v",
          bus_->versions_.back().manifest.policy_version()));
    }
    bus_->versions_.push_back({manifest, std::move(bytes)});
    while (bus_->versions_.size() > bus_->retain_) bus_->versions_.pop_front();
    return absl::OkStatus();
  }

 private:
  InProcessWeightBus* bus_;
};

class InProcessReceiver : public WeightReceiver {
 public:
  explicit InProcessReceiver(InProcessWeightBus* bus) : bus_(bus) {}

  absl::StatusOr<uint64_t> ReceiveNext(StagingWeights* staging,
                                       absl::Time deadline) override {
    if (staging->ready()) {
      return absl::FailedPreconditionError(
          "a received weights version is staged but not committed");
    }
    const std::optional<uint64_t> live = staging->live_version();
    InProcessWeightBus::Published pick;
    bool corrupt = false;
    uint64_t corrupt_offset = 0;
    {
      absl::MutexLock lock(&bus_->mu_);
      auto has_newer = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(bus_->mu_) {
        return cancelled_ ||
               (!bus_->versions_.empty() &&
                (!live.has_value() ||
                 bus_->versions_.back().manifest.policy_version() > *live));
      };
      bus_->mu_.AwaitWithDeadline(absl::Condition(&has_newer), deadline);
      if (cancelled_) return absl::CancelledError("weight receiver cancelled");
      if (!has_newer()) {
        return absl::DeadlineExceededError(
            "no new weights version before the deadline");
      }
      const InProcessWeightBus::Published* chosen = nullptr;
      // Newest full version wins (skips ahead); otherwise the next version
      // in order, which must then be a delta on live.
      const auto& newest = bus_->versions_.back();
      if (newest.manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL) {
        chosen = &newest;
      } else if (live.has_value()) {
        for (const auto& p : bus_->versions_) {
          if (p.manifest.policy_version() == *live + 1) chosen = &p;
        }
      }
      if (chosen == nullptr) {
        // Catch up from the newest retained full version, if any.
        for (const auto& p : bus_->versions_) {
          if (p.manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL &&
              (!live.has_value() || p.manifest.policy_version() > *live)) {
            chosen = &p;
          }
        }
      }
      if (chosen == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "no retained weights version applies to live version ",
            live.has_value() ? absl::StrCat("v", *live) : std::string("none"),
            "; catch up over the pull path"));
      }
      pick = *chosen;
      corrupt = bus_->corrupt_next_;
      corrupt_offset = bus_->corrupt_offset_;
      bus_->corrupt_next_ = false;
    }
    absl::Span<const uint8_t> payload(*pick.payload);
    std::vector<uint8_t> damaged;
    if (corrupt && !payload.empty()) {
      damaged.assign(payload.begin(), payload.end());
      damaged[corrupt_offset % damaged.size()] ^= 0x01;
      payload = damaged;
    }
    if (absl::Status s = StagePayload(staging, pick.manifest, payload);
        !s.ok()) {
      return s;
    }
    return pick.manifest.policy_version();
  }

  void Cancel() override {
    absl::MutexLock lock(&bus_->mu_);
    cancelled_ = true;
  }

 private:
  InProcessWeightBus* bus_;
  bool cancelled_ = false;  // guarded by bus_->mu_
};

InProcessWeightBus::InProcessWeightBus(size_t retain)
    : retain_(std::max<size_t>(retain, 1)) {}

std::unique_ptr<WeightSender> InProcessWeightBus::NewSender() {
  return std::make_unique<InProcessSender>(this);
}

std::unique_ptr<WeightReceiver> InProcessWeightBus::NewReceiver() {
  return std::make_unique<InProcessReceiver>(this);
}

void InProcessWeightBus::CorruptNextDeliveryForTest(uint64_t offset) {
  absl::MutexLock lock(&mu_);
  corrupt_next_ = true;
  corrupt_offset_ = offset;
}

}  // namespace tandem::weights
