#pragma once

// Private to weight_server.cc and raw_data_server.cc: the stream state the
// gRPC and raw paths share, and the raw data path's server. Nothing else
// includes this header.

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/weights/data_plane_seal.h"
#include "common/weights/pull/data_plane_auth.h"
#include "common/weights/pull/weight_server.h"

namespace tandem::weights {

struct WeightServerService::Stream {
  StoredPayload payload;
  uint32_t bucket = 0;
  uint64_t offset = 0;
  uint32_t chunk_bytes = 0;
  int sent = 0;
  bool raw = false;  // the raw data path (see OpenStream)
  // Set when the request is answered with a shared-memory segment.
  std::shared_ptr<const SharedWeightSegment> segment;
  // Set when it is answered with device memory (CUDA IPC): the lease.
  std::shared_ptr<const DeviceWeightBuffer> device;

  bool full() const {
    return payload.manifest.kind() == v1::WEIGHT_PAYLOAD_KIND_FULL;
  }
  bool done() const {
    return bucket >=
           (full() ? static_cast<uint32_t>(payload.manifest.buckets_size())
                   : 1u);
  }
};

struct WeightServerService::NextChunk {
  uint32_t bucket = 0;
  uint64_t offset = 0;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  uint32_t crc32c = 0;
  bool bucket_complete = false;
  // Fault injection: send data[size / 2] ^ 0x10 instead of data[size / 2].
  bool corrupt = false;
};

// The raw data path, with bounded resources whatever its clients do: one
// event-loop thread accepts connections and reads their requests
// (non-blocking, each within data_request_timeout), and a fixed pool of
// data_stream_threads threads streams the answers (blocking sends, each
// allowed data_send_timeout without progress); requests wait in a queue
// for a free thread. At most max_data_connections connections are open in
// all. A connection over the cap evicts the oldest connection that has not
// sent its request yet (an idle socket costs the server a slot, never a
// thread), or, when every slot is queued or streaming, is closed at once.
// When accept() fails for want of a resource (EMFILE, ENFILE, ENOBUFS,
// ENOMEM) the oldest idle connection is closed and accept() tried again;
// with none to close, accepting pauses for a back-off (10 ms doubling to
// 1 s), so the loop never spins. Every
// connection closed unserved is counted by reason (WeightSyncMetrics).
//
// Thread-safety: constructed and destroyed on one thread; stats() from
// any. The destructor stops the loop, shuts down every open connection and
// joins every thread.
class WeightServerService::RawDataServer {
 public:
  // Listens on options.data_host:data_port; null (logged) when that fails.
  static std::unique_ptr<RawDataServer> Start(
      WeightServerService* service, const WeightServerOptions& options);
  ~RawDataServer();

  uint16_t port() const { return port_; }
  // Fills the data-path fields of `stats`.
  void FillStats(WeightServerStats* stats) const;

 private:
  // A connection whose request has not fully arrived (the loop's).
  struct Pending {
    int fd = -1;
    absl::Time deadline;
    std::string bytes;  // what arrived so far
    // With options.data_plane_key: the key and challenge this connection
    // must answer before its request; `proven` once it has.
    std::optional<DataPlaneKey> key;
    RawChallenge challenge{};
    bool proven = false;
    // Once proven: the key the stream to this connection is sealed with
    // (data_plane_seal.h; the challenge's nonce is its salt).
    std::optional<WeightSeal> seal;
  };
  struct Ready {
    int fd = -1;
    v1::FetchWeightsRequest request;
    std::optional<WeightSeal> seal;  // set: every byte sent is sealed
  };
  enum class ReadResult { kMore, kReady, kClosed };

  RawDataServer(WeightServerService* service,
                const WeightServerOptions& options, int listener,
                uint16_t port);

  void EventLoop();
  void AcceptAll(absl::Time now);
  ReadResult ReadRequest(Pending& pending, v1::FetchWeightsRequest* request);
  // With a data-plane key: sends `pending` its challenge. Null when sent;
  // else "": the connection is to be dropped, and is counted already
  // (kNoSecret, logged and answered: there is no key yet) or not at all
  // (the peer has gone).
  const char* SendChallenge(Pending& pending);
  // Checks the proof once it has arrived: kMore while it has not, kReady
  // when it is good (its bytes consumed), kClosed (refused: answered
  // UNAUTHENTICATED, counted and logged) otherwise.
  ReadResult ReadProof(Pending& pending);
  // Logs a refused connection, at most one line a second (with how many
  // were not logged since the last line).
  void LogRefusal(const std::string& line);
  // Closes a pending connection unserved, counting `reason` (null: the
  // peer left, nothing counted).
  void DropPending(std::list<Pending>::iterator it, const char* reason);
  void CountDropped(const char* reason);
  void SetOpen(int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StreamLoop();
  // Serves one request; false when a send timed out.
  // With `seal`, everything after the proof is sent in sealed records
  // (weight_server.h, "Raw data path confidentiality").
  bool Serve(int fd, const v1::FetchWeightsRequest& request,
             const WeightSeal* seal);

  WeightServerService* const service_;
  const int max_connections_;
  const int stream_threads_;
  const absl::Duration request_timeout_;
  const absl::Duration send_timeout_;
  const int listener_;
  const uint16_t port_;
  int wake_[2] = {-1, -1};  // a pipe that wakes the loop to stop
  std::thread loop_;
  std::vector<std::thread> streamers_;
  std::atomic<bool> stopping_{false};

  // Event-loop thread only. Oldest first.
  std::list<Pending> pending_;
  absl::Time accept_paused_until_ = absl::InfinitePast();
  absl::Duration accept_backoff_ = absl::ZeroDuration();
  absl::Time next_refusal_log_ = absl::InfinitePast();
  uint64_t refusals_not_logged_ = 0;

  mutable absl::Mutex mu_;
  std::deque<Ready> ready_ ABSL_GUARDED_BY(mu_);
  std::set<int> streaming_ ABSL_GUARDED_BY(mu_);
  // Pending, ready and streaming connections.
  int open_ ABSL_GUARDED_BY(mu_) = 0;

  std::atomic<uint64_t> over_capacity_{0};
  std::atomic<uint64_t> evicted_{0};
  std::atomic<uint64_t> request_timeouts_{0};
  std::atomic<uint64_t> send_timeouts_{0};
  std::atomic<uint64_t> accept_errors_{0};
  std::atomic<uint64_t> auth_refused_{0};
};

}  // namespace tandem::weights
