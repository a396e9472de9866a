#pragma once

// The reward verifier daemon: scores batches of completions with the
// verifiers of the scorer registry, on a thread pool, under a concurrency
// limit (RESOURCE_EXHAUSTED beyond it).

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster/member_daemon.h"
#include "services/verifier/scoring/scorer_registry.h"
#include "services/verifier/verifier_config.h"
#include "services/verifier/verifier_metrics.h"
#include "tandem/v1/verifier.grpc.pb.h"

namespace tandem::verifier {

class Verifier : public tandem::v1::Verifier::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<Verifier>> Create(
      const VerifierConfig& config);
  ~Verifier() override;

  absl::Status Start();
  // Health NOT_SERVING, new batches refused with UNAVAILABLE, batches being
  // scored finish (each bounded by the sandbox limits), then stop.
  void GracefulStop(absl::Duration deadline);
  void Stop();

  // host:port of the gRPC server (bound at Create).
  const std::string& grpc_address() const { return member_->grpc_address(); }

  // tandem.v1.Verifier
  grpc::ServerUnaryReactor* ScoreBatch(
      grpc::CallbackServerContext* context,
      const tandem::v1::ScoreBatchRequest* request,
      tandem::v1::ScoreBatchResponse* response) override;
  grpc::ServerUnaryReactor* ListVerifiers(
      grpc::CallbackServerContext* context,
      const tandem::v1::ListVerifiersRequest* request,
      tandem::v1::ListVerifiersResponse* response) override;

 private:
  explicit Verifier(const VerifierConfig& config);
  absl::Status ValidateBatch(const tandem::v1::ScoreBatchRequest& request);
  void ScoreAll(const tandem::v1::ScoreBatchRequest& request,
                tandem::v1::ScoreBatchResponse* response);

  const VerifierConfig config_;
  std::shared_ptr<prometheus::Registry> registry_;
  VerifierMetrics metrics_;
  // Built once at Create; read-only afterwards, so shared without a lock.
  std::map<std::string, std::unique_ptr<Scorer>> scorers_;
  boost::asio::thread_pool pool_;
  std::unique_ptr<cluster::MemberDaemon> member_;
  std::atomic<int64_t> inflight_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace tandem::verifier
