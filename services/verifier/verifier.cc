#include "services/verifier/verifier.h"

#include <boost/asio/post.hpp>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_client.h"

namespace tandem::verifier {
namespace {

auto Log() { return ComponentLogger("verifier"); }

}  // namespace

Verifier::Verifier(const VerifierConfig& config)
    : config_(config),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_),
      pool_(static_cast<size_t>(config.worker_threads)) {}

absl::StatusOr<std::unique_ptr<Verifier>> Verifier::Create(
    const VerifierConfig& config) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<Verifier> verifier(new Verifier(config));
  BuiltinScorerConfig builtin;
  SandboxLimits& limits = builtin.sandbox.limits;
  limits.cpu_seconds = static_cast<int>(config.code_cpu_seconds);
  limits.wall_seconds = config.code_wall_seconds;
  limits.address_space_bytes = config.code_address_space_bytes;
  limits.max_output_bytes = config.code_max_output_bytes;
  limits.max_processes = static_cast<int>(config.code_max_processes);
  limits.allow_network_fallback = config.code_allow_network_fallback;
  builtin.sandbox.private_filesystem = config.code_private_filesystem;
  ScorerRegistry scorer_registry;
  RETURN_IF_ERROR(RegisterBuiltinScorers(builtin, &scorer_registry));
  std::vector<std::string> names = config.verifiers;
  if (names.empty()) names = scorer_registry.Names();
  const std::vector<std::string> known = scorer_registry.Names();
  for (const std::string& name : names) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("verifiers: unknown verifier '", name,
                       "' (known: ", absl::StrJoin(known, ", "), ")"));
    }
    ASSIGN_OR_RETURN(verifier->scorers_[name], scorer_registry.Create(name));
  }
  Verifier* self = verifier.get();
  ASSIGN_OR_RETURN(verifier->member_,
                   cluster::MemberDaemon::Create(
                       "verifier", tandem::v1::ROLE_VERIFIER, config.server,
                       config.coordinator_address, verifier->registry_, {self},
                       [self](tandem::v1::HeartbeatRequest* r) {
                         r->mutable_load()->set_running(
                             static_cast<uint32_t>(self->inflight_.load()));
                         if (self->stopping_) {
                           r->set_state(tandem::v1::MEMBER_STATE_DRAINING);
                         }
                       },
                       {{"verifiers", absl::StrJoin(names, ",")}}));
  Log()->info("verifiers: {}", absl::StrJoin(names, ", "));
  return verifier;
}

Verifier::~Verifier() { Stop(); }

absl::Status Verifier::Start() { return member_->Start(); }

absl::Status Verifier::ValidateBatch(
    const tandem::v1::ScoreBatchRequest& request) {
  for (int i = 0; i < request.items_size(); ++i) {
    const tandem::v1::ScoreItem& item = request.items(i);
    auto it = scorers_.find(item.verifier());
    if (it == scorers_.end()) {
      std::vector<std::string> known;
      for (const auto& [name, scorer] : scorers_) known.push_back(name);
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].verifier: unknown verifier '", item.verifier(),
          "' (known: ", absl::StrJoin(known, ", "), ")"));
    }
    ScoreRequest score_request;
    score_request.completion_text = item.completion_text();
    score_request.prompt_text = item.prompt_text();
    score_request.metadata.insert(item.metadata().begin(),
                                  item.metadata().end());
    absl::Status status = it->second->Validate(score_request);
    if (!status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "] (", item.verifier(), "): ", status.message()));
    }
  }
  return absl::OkStatus();
}

void Verifier::ScoreAll(const tandem::v1::ScoreBatchRequest& request,
                        tandem::v1::ScoreBatchResponse* response) {
  for (const tandem::v1::ScoreItem& item : request.items()) {
    ScoreRequest score_request;
    score_request.completion_text = item.completion_text();
    score_request.prompt_text = item.prompt_text();
    score_request.metadata.insert(item.metadata().begin(),
                                  item.metadata().end());
    const absl::Time start = absl::Now();
    ScoreResult result = scorers_.at(item.verifier())->Score(score_request);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    metrics_.Observe(item.verifier(), result.outcome, seconds);
    for (absl::string_view kill : result.sandbox_kills) {
      metrics_.CountSandboxKill(kill);
    }
    tandem::v1::ScoreResult* out = response->add_results();
    out->set_item_id(item.item_id());
    out->set_seconds(seconds);
    out->mutable_score()->set_reward(result.reward);
    out->mutable_score()->set_outcome(result.outcome);
    out->mutable_score()->set_reason(result.reason);
  }
}

grpc::ServerUnaryReactor* Verifier::ScoreBatch(
    grpc::CallbackServerContext* context,
    const tandem::v1::ScoreBatchRequest* request,
    tandem::v1::ScoreBatchResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (stopping_) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "verifier is shutting down"));
    return reactor;
  }
  if (absl::Status status = ValidateBatch(*request); !status.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(status));
    return reactor;
  }
  const int64_t n = request->items_size();
  const int64_t before = inflight_.fetch_add(n);
  if (before > 0 && before + n > config_.max_concurrency) {
    inflight_.fetch_sub(n);
    metrics_.rejected().Increment();
    reactor->Finish(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("verifier busy: ", before, " items in flight, limit ",
                     config_.max_concurrency)));
    return reactor;
  }
  metrics_.inflight().Set(static_cast<double>(before + n));
  boost::asio::post(pool_, [this, reactor, request, response, n] {
    ScoreAll(*request, response);
    metrics_.inflight().Set(static_cast<double>(inflight_.fetch_sub(n) - n));
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* Verifier::ListVerifiers(
    grpc::CallbackServerContext* context,
    const tandem::v1::ListVerifiersRequest* request,
    tandem::v1::ListVerifiersResponse* response) {
  for (const auto& [name, scorer] : scorers_) response->add_names(name);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void Verifier::GracefulStop(absl::Duration deadline) {
  stopping_ = true;
  member_->MarkNotServing();
  member_->Shutdown(deadline);
  Stop();
}

void Verifier::Stop() {
  stopping_ = true;
  if (stopped_.exchange(true)) return;
  if (member_) member_->Shutdown(absl::ZeroDuration());
  pool_.join();
}

}  // namespace tandem::verifier
