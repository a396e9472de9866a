#pragma once

// GrpcPullReceiver: the worker's end of the catch-up (pull) path, a
// WeightReceiver over the tandem.v1.WeightServer service (weight_server.h).
//
// ReceiveNext() asks for the latest manifest and stages, in order of
// preference: the next delta on the live version (when live is at or past
// the latest anchor, or the version just before it: the server may hold a
// delta for an anchor too), otherwise the newest full version the server
// holds.
// A late joiner therefore fetches one full copy and then follows deltas.
// Every chunk's CRC-32C is checked; a bad chunk or a broken stream resumes
// from the first unverified byte (up to max_attempts times without
// progress), and every bucket is verified against the manifest before the
// version can be committed.
//
// Thread-safety: ReceiveNext() from one thread; Cancel() and stats() from
// any thread.

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/weights/weight_transport.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace tandem::weights {

struct PullOptions {
  // Requested chunk size; the server caps it (1 MiB by default).
  uint32_t chunk_bytes = 1u << 20;
  // Consecutive stream failures without progress before giving up.
  int max_attempts = 5;
  // How often to ask for a newer version while waiting.
  absl::Duration poll_interval = absl::Milliseconds(100);
};

struct PullStats {
  uint64_t versions = 0;
  uint64_t bytes = 0;
  uint64_t resumes = 0;           // streams restarted mid-payload
  uint64_t chunk_crc_errors = 0;  // chunks discarded for a bad CRC
};

class GrpcPullReceiver : public WeightReceiver {
 public:
  GrpcPullReceiver(std::shared_ptr<grpc::ChannelInterface> channel,
                   PullOptions options);

  absl::StatusOr<uint64_t> ReceiveNext(StagingWeights* staging,
                                       absl::Time deadline) override;
  void Cancel() override;

  // Fetches exactly the payload `manifest` describes into `staging`.
  absl::Status Fetch(StagingWeights* staging,
                     const v1::WeightManifest& manifest, absl::Time deadline);

  PullStats stats() const;

 private:
  absl::StatusOr<v1::WeightManifest> GetManifest(uint64_t version,
                                                 absl::Time deadline);
  // The manifest of the payload to fetch next, or DeadlineExceeded when
  // nothing newer than live appears before `deadline`.
  absl::StatusOr<v1::WeightManifest> Plan(StagingWeights* staging,
                                          absl::Time deadline);
  // Reads one stream from the resume point; advances it past every chunk
  // written. Returns the stream's status.
  absl::Status ReadStream(StagingWeights* staging,
                          const v1::WeightManifest& manifest,
                          absl::Time deadline, uint32_t* bucket,
                          uint64_t* offset, std::vector<uint8_t>* delta);
  bool cancelled() const;

  std::unique_ptr<v1::WeightServer::Stub> stub_;
  const PullOptions options_;
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* active_ ABSL_GUARDED_BY(mu_) = nullptr;
  PullStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::weights
