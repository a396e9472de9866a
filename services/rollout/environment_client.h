#pragma once

// EnvironmentClient: the rollout worker's non-blocking client of a
// tandem.v1.Environment service (docs/environments.md). The engine thread
// must never wait for an environment, so every call returns at once: it is
// sent with the gRPC callback API under its own deadline, and its answer
// (or its error: DEADLINE_EXCEEDED for an environment that hangs,
// UNAVAILABLE for one that is gone) is queued for TakeCompleted(), which
// the engine thread polls between steps. No thread of its own.
//
// Thread safety: all methods may be called from any thread. Stop() cancels
// the calls in flight and returns once each one's callback has run; it is
// idempotent and the destructor calls it. Calls made after Stop() complete
// at once with UNAVAILABLE.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tandem/v1/environment.grpc.pb.h"

namespace tandem::rollout {

struct EnvironmentClientOptions {
  // Deadlines per call. A Step that takes longer ends the episode (the
  // caller decides); the environment's own limits are usually shorter.
  absl::Duration open_timeout = absl::Seconds(10);
  absl::Duration step_timeout = absl::Seconds(30);
  absl::Duration close_timeout = absl::Seconds(5);
};

// One finished call. `key` is the caller's tag (e.g. "lease/sample").
struct EnvironmentReply {
  enum class Kind { kOpen, kStep, kClose };
  Kind kind = Kind::kOpen;
  std::string key;
  // The RPC's status, converted; the message names the call and the
  // address ("Step of episode e-3 at 127.0.0.1:5000: deadline exceeded
  // after 30s").
  absl::Status status;
  tandem::v1::OpenEpisodeResponse open;
  tandem::v1::StepResponse step;
  double seconds = 0.0;
};

class EnvironmentClient {
 public:
  EnvironmentClient(std::shared_ptr<grpc::Channel> channel, std::string address,
                    EnvironmentClientOptions options);
  ~EnvironmentClient();
  EnvironmentClient(const EnvironmentClient&) = delete;
  EnvironmentClient& operator=(const EnvironmentClient&) = delete;

  void Open(std::string key, tandem::v1::OpenEpisodeRequest request);
  void Step(std::string key, tandem::v1::StepRequest request);
  // Closes an episode; its reply is queued like the others (callers that
  // do not care drop it).
  void Close(std::string key, std::string episode_id);

  // Replies that arrived since the last call, in arrival order.
  std::vector<EnvironmentReply> TakeCompleted();
  // Waits until a reply is queued or `timeout` passes; true when one is.
  bool WaitForReply(absl::Duration timeout);
  int32_t in_flight() const;

  void Stop();

 private:
  struct Call {
    EnvironmentReply::Kind kind;
    std::string key;
    std::string what;  // "Step of episode e-3", for errors
    absl::Time started;
    grpc::ClientContext context;
    tandem::v1::OpenEpisodeRequest open_request;
    tandem::v1::StepRequest step_request;
    tandem::v1::CloseEpisodeRequest close_request;
    tandem::v1::OpenEpisodeResponse open_response;
    tandem::v1::StepResponse step_response;
    tandem::v1::CloseEpisodeResponse close_response;
  };

  // Registers `call` and returns its id, or 0 after Stop (the call is then
  // completed with UNAVAILABLE).
  uint64_t Begin(std::unique_ptr<Call> call, absl::Duration timeout);
  void Done(uint64_t id, const grpc::Status& status);

  const std::unique_ptr<tandem::v1::Environment::Stub> stub_;
  const std::string address_;
  const EnvironmentClientOptions options_;

  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Calls in flight, by id; each is erased by its own callback.
  // Shared so that Stop() can cancel one outside mu_ while its callback
  // erases it.
  std::map<uint64_t, std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<EnvironmentReply> completed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::rollout
