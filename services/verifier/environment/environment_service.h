#pragma once

// tandem.v1.Environment on the verifier's gRPC port (environment.proto,
// docs/environments.md): an adapter over EpisodeTable. List, Open and
// Close answer on the gRPC thread (they only touch the table); Step runs on
// the service's own thread pool, since the task's scorer may run a
// sandboxed program. A reaper thread frees idle episodes.

#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "boost/asio/thread_pool.hpp"
#include "services/verifier/environment/episode_table.h"
#include "tandem/v1/environment.grpc.pb.h"

namespace tandem::verifier {

class EnvironmentService : public tandem::v1::Environment::CallbackService {
 public:
  EnvironmentService(
      const EnvironmentConfig& config,
      const std::map<std::string, std::unique_ptr<Scorer>>* scorers,
      prometheus::Registry& registry, int step_threads,
      absl::Duration score_timeout);
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

  const EnvironmentConfig config_;
  EnvironmentMetrics metrics_;
  EpisodeTable table_;
  boost::asio::thread_pool pool_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace tandem::verifier
