#pragma once

// tandem.v1.Environment on the verifier's gRPC port (environment.proto,
// docs/environments.md): an adapter over EpisodeTable. List, Open and
// Close answer on the gRPC thread (they only touch the table); Step runs on
// the service's own thread pool, since the task's scorer may run a
// sandboxed program. A reaper thread frees idle episodes.
//
// Under mutual TLS (`tls_enabled`) only rollout workers open, step and
// close episodes (and an admin may list the environments), and an episode
// belongs to the identity that opened it: another worker's certificate
// gets PERMISSION_DENIED for it. Each refusal is reported to `refused`
// with its reason (unauthenticated, wrong_role, other_member).

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/status/statusor.h"
#include "boost/asio/thread_pool.hpp"
#include "common/base/clock.h"
#include "common/rpc/peer_identity.h"
#include "services/verifier/environment/episode_table.h"
#include "tandem/v1/environment.grpc.pb.h"

namespace tandem::verifier {

class EnvironmentService : public tandem::v1::Environment::CallbackService {
 public:
  EnvironmentService(
      const EnvironmentConfig& config,
      const std::map<std::string, std::unique_ptr<Scorer>>* scorers,
      prometheus::Registry& registry, int step_threads,
      absl::Duration score_timeout, bool tls_enabled = false,
      std::function<void(const char* reason)> refused = nullptr,
      Clock* clock = RealClock());
  ~EnvironmentService() override;

  // Kills the programs of running steps, so that they answer at once; call
  // before shutting the gRPC server down.
  void Cancel() { table_.Cancel(); }
  // Stops the reaper and waits for running steps. Idempotent; call after
  // the gRPC server has shut down.
  void Stop();

  grpc::ServerUnaryReactor* ListEnvironments(
      grpc::CallbackServerContext* context,
      const tandem::v1::ListEnvironmentsRequest* request,
      tandem::v1::ListEnvironmentsResponse* response) override;
  grpc::ServerUnaryReactor* OpenEpisode(
      grpc::CallbackServerContext* context,
      const tandem::v1::OpenEpisodeRequest* request,
      tandem::v1::OpenEpisodeResponse* response) override;
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* context,
                                 const tandem::v1::StepRequest* request,
                                 tandem::v1::StepResponse* response) override;
  grpc::ServerUnaryReactor* CloseEpisode(
      grpc::CallbackServerContext* context,
      const tandem::v1::CloseEpisodeRequest* request,
      tandem::v1::CloseEpisodeResponse* response) override;

 private:
  void ReapLoop();
  // The caller's identity (its SPIFFE ID; empty with TLS off) when it has
  // one of `allowed`, else the refusal, counted and logged.
  absl::StatusOr<std::string> Caller(const grpc::CallbackServerContext& context,
                                     const char* rpc,
                                     rpc::PeerRoleSet allowed) const;
  // Counts and logs a refusal of the episode table (another owner's
  // episode) and passes `status` on.
  absl::Status CountOwnerRefusal(const grpc::CallbackServerContext& context,
                                 absl::Status status) const;

  const EnvironmentConfig config_;
  const bool tls_enabled_;
  const std::function<void(const char*)> refused_;
  Clock* const clock_;  // times the reaper and the episode limits
  EnvironmentMetrics metrics_;
  EpisodeTable table_;
  boost::asio::thread_pool pool_;
  // Guards stop_, which ends the reaper.
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace tandem::verifier
