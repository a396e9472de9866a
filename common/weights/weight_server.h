#pragma once

// WeightServerService: the trainer's end of the catch-up (pull) path, the
// tandem.v1.WeightServer gRPC service over a WeightStore.
//
// FetchWeights streams one payload in chunks of at most max_chunk_bytes
// (1 MiB by default, well under gRPC's 4 MiB message limit), each carrying
// its CRC-32C. Addressing:
//   FULL payloads:  (bucket, offset inside the bucket); a chunk never
//                   crosses a bucket boundary and the last chunk of each
//                   bucket has bucket_complete set.
//   DELTA payloads: the encoded delta is one blob addressed as bucket 0,
//                   offset = byte offset in the blob; bucket_complete marks
//                   its last chunk.
// A client resumes a broken stream by asking again from the first byte it
// has not verified (start_bucket, start_offset).
//
// Status codes: NOT_FOUND for a version/kind no longer retained,
// INVALID_ARGUMENT for a resume point outside the payload.
//
// Thread-safety: all methods may be called concurrently. Chunks are built
// (one memcpy and CRC of <= 1 MiB) on the reactor's callback thread; the
// reactor never waits on anything else.

#include <atomic>
#include <cstdint>

#include "common/weights/weight_store.h"
#include "common/weights/weight_sync_metrics.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace tandem::weights {

struct WeightServerOptions {
  uint32_t max_chunk_bytes = 1u << 20;
  // Optional: every chunk sent is counted as tandem_weight_sync_bytes_total
  // {direction="sent", transport="pull", kind}. Must outlive the service.
  WeightSyncMetrics* metrics = nullptr;
};

struct WeightServerStats {
  uint64_t streams = 0;
  uint64_t chunks = 0;
  uint64_t bytes = 0;
};

class WeightServerService final : public v1::WeightServer::CallbackService {
 public:
  // `store` must outlive the service.
  WeightServerService(const WeightStore* store, WeightServerOptions options);

  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* context,
                                        const v1::GetManifestRequest* request,
                                        v1::WeightManifest* response) override;

  grpc::ServerWriteReactor<v1::WeightChunk>* FetchWeights(
      grpc::CallbackServerContext* context,
      const v1::FetchWeightsRequest* request) override;

  WeightServerStats stats() const;

  // Fault injection for tests: every later stream fails with UNAVAILABLE
  // after sending `chunks` chunks (negative: never).
  void FailStreamsAfterChunksForTest(int chunks) { fail_after_ = chunks; }
  // The `index`-th chunk sent from now on (counting across streams) has one
  // data byte flipped after its CRC was computed.
  void CorruptChunkForTest(int64_t index) {
    corrupt_at_ = static_cast<int64_t>(chunks_.load()) + index;
  }

 private:
  class FetchReactor;

  const WeightStore* store_;
  const WeightServerOptions options_;
  std::atomic<uint64_t> streams_{0};
  std::atomic<uint64_t> chunks_{0};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int> fail_after_{-1};
  std::atomic<int64_t> corrupt_at_{-1};
};

}  // namespace tandem::weights
