// Poison resistance of a real coordinator over loopback gRPC: every kind of
// bad sample in a SubmitSamples call (NaN, infinite or positive log-probs,
// a log-prob count that is not one per token, negative token ids,
// malformed version spans, versions outside [dispatch - max_lag,
// published + 1], a lease another member holds, fields over their size
// limit) refuses the whole call with INVALID_ARGUMENT (PERMISSION_DENIED
// for the lease), names the field and value, counts the reason, and stores
// nothing, not even the call's valid samples. A worker that registered
// again after a coordinator restart (previous_member_id) still delivers
// for the leases its old self held. Every other RPC refuses fields over
// their limits (a 300-byte host name, too many capabilities), and the
// table of limits covers every string, repeated and map field of every
// Coordinator request.

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator_test_util.h"
#include "google/protobuf/descriptor.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/request_limits.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::coordinator {
namespace {

using tandem::v1::Sample;
using testing::MakeSample;

constexpr uint32_t kGroupSize = 2;
constexpr uint32_t kMaxLag = 1;

struct Cluster {
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<tandem::v1::Coordinator::Stub> stub;
  std::string trainer_id;
  uint64_t version = 0;

  explicit Cluster(const std::string& journal_dir = "") {
    CoordinatorConfig config;
    config.server.grpc_address = "127.0.0.1:0";
    config.server.metrics_address = "";
    config.group_size = kGroupSize;
    config.max_lag = kMaxLag;
    config.journal.dir = journal_dir;
    config.training.groups_per_version = 100;
    auto created = Coordinator::Create(config);
    REQUIRE(created.ok());
    coordinator = *std::move(created);
    REQUIRE(coordinator->Start().ok());
    stub = tandem::v1::Coordinator::NewStub(grpc::CreateChannel(
        coordinator->grpc_address(), grpc::InsecureChannelCredentials()));
    trainer_id = Register(tandem::v1::ROLE_TRAINER);
  }
  ~Cluster() { coordinator->Stop(); }

  grpc::Status TryRegister(const tandem::v1::RegisterRequest& request,
                           std::string* member_id = nullptr) {
    tandem::v1::RegisterResponse response;
    grpc::ClientContext context;
    grpc::Status status = stub->Register(&context, request, &response);
    if (member_id != nullptr) *member_id = response.member_id();
    return status;
  }
  std::string Register(tandem::v1::Role role,
                       const std::string& previous = "") {
    tandem::v1::RegisterRequest request;
    request.set_role(role);
    request.set_grpc_address("127.0.0.1:1");
    request.set_hostname("test");
    request.set_previous_member_id(previous);
    std::string id;
    REQUIRE(TryRegister(request, &id).ok());
    return id;
  }
  void Publish() {
    tandem::v1::PublishPolicyVersionRequest request;
    request.set_member_id(trainer_id);
    request.mutable_manifest()->set_policy_version(++version);
    tandem::v1::PublishPolicyVersionResponse response;
    grpc::ClientContext context;
    REQUIRE(stub->PublishPolicyVersion(&context, request, &response).ok());
  }
  tandem::v1::PromptLease Lease(const std::string& member) {
    tandem::v1::LeasePromptsRequest request;
    request.set_member_id(member);
    request.set_max_prompts(1);
    request.set_policy_version(version);
    tandem::v1::LeasePromptsResponse response;
    grpc::ClientContext context;
    REQUIRE(stub->LeasePrompts(&context, request, &response).ok());
    REQUIRE(response.leases_size() == 1);
    return response.leases(0);
  }
  grpc::Status Submit(const std::string& member,
                      const std::vector<Sample>& samples,
                      tandem::v1::SubmitSamplesResponse* response) {
    tandem::v1::SubmitSamplesRequest request;
    request.set_member_id(member);
    for (const Sample& s : samples) *request.add_samples() = s;
    grpc::ClientContext context;
    return stub->SubmitSamples(&context, request, response);
  }
  tandem::v1::GetClusterStatusResponse Status() {
    tandem::v1::GetClusterStatusResponse response;
    grpc::ClientContext context;
    REQUIRE(stub->GetClusterStatus(
                    &context, tandem::v1::GetClusterStatusRequest(), &response)
                .ok());
    return response;
  }
  // Value of one labelled counter in the /metrics text (0 when absent).
  double Counter(const std::string& name, const std::string& labels) {
    const std::string text = coordinator->MetricsTextForTest();
    const std::string key = absl::StrCat(name, "{", labels, "} ");
    const size_t at = text.find(key);
    if (at == std::string::npos) return 0;
    return std::stod(text.substr(at + key.size()));
  }
};

// One poisoned sample and what the coordinator must say about it.
struct Poison {
  std::string name;
  std::function<void(Sample*)> poison;
  grpc::StatusCode code;
  std::string message;  // a substring of the error
  std::string reason;   // the metric label
};

std::vector<Poison> Poisons() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto invalid = grpc::StatusCode::INVALID_ARGUMENT;
  return {
      {"NaN log-prob", [=](Sample* s) { s->set_behavior_logprobs(1, nan); },
       invalid, "samples[1].behavior_logprobs[1] is nan", "logprob_value"},
      {"-inf log-prob", [=](Sample* s) { s->set_behavior_logprobs(0, -inf); },
       invalid, "samples[1].behavior_logprobs[0] is -inf", "logprob_value"},
      {"positive log-prob",
       [](Sample* s) { s->set_behavior_logprobs(0, 0.5f); }, invalid,
       "samples[1].behavior_logprobs[0] is 0.5", "logprob_value"},
      {"missing log-probs", [](Sample* s) { s->clear_behavior_logprobs(); },
       invalid, "samples[1].behavior_logprobs has 0 entries for 2",
       "logprob_count"},
      {"negative token id",
       [](Sample* s) { s->set_completion_token_ids(1, -4); }, invalid,
       "samples[1].completion_token_ids[1] is -4", "token_id"},
      {"future version",
       [](Sample* s) {
         s->mutable_version_spans(0)->set_policy_version(1000000);
       },
       invalid,
       "samples[1].version_spans[0].policy_version is 1000000; allowed for "
       "this lease: 2 to 4",
       "version_range"},
      {"version too old for max_lag",
       [](Sample* s) { s->mutable_version_spans(0)->set_policy_version(1); },
       invalid, "samples[1].version_spans[0].policy_version is 1",
       "version_range"},
      {"spans short of the tokens",
       [](Sample* s) { s->mutable_version_spans(0)->set_num_tokens(1); },
       invalid, "samples[1].version_spans cover 1 tokens, the sample has 2",
       "version_spans"},
      {"empty span",
       [](Sample* s) {
         s->mutable_version_spans(0)->set_num_tokens(2);
         s->add_version_spans()->set_policy_version(3);
       },
       invalid, "samples[1].version_spans[1].num_tokens is 0", "version_spans"},
      {"versions going backwards",
       [](Sample* s) {
         s->mutable_version_spans(0)->set_num_tokens(1);
         s->mutable_version_spans(0)->set_policy_version(4);
         auto* span = s->add_version_spans();
         span->set_policy_version(3);
         span->set_num_tokens(1);
       },
       invalid, "samples[1].version_spans[1].policy_version is 3, older",
       "version_spans"},
      {"source spans short of the tokens",
       [](Sample* s) {
         auto* span = s->add_source_spans();
         span->set_source(tandem::v1::TOKEN_SOURCE_MODEL);
         span->set_num_tokens(1);
       },
       invalid, "samples[1].source_spans cover 1 tokens, the sample has 2",
       "source_spans"},
      {"empty source span",
       [](Sample* s) {
         s->add_source_spans()->set_num_tokens(2);
         s->add_source_spans();
       },
       invalid, "samples[1].source_spans[1].num_tokens is 0", "source_spans"},
      {"unknown token source",
       [](Sample* s) {
         auto* span = s->add_source_spans();
         span->set_source(static_cast<tandem::v1::TokenSource>(7));
         span->set_num_tokens(2);
       },
       invalid, "samples[1].source_spans[0].source is 7", "source_spans"},
      {"no token of the model",
       [](Sample* s) {
         auto* span = s->add_source_spans();
         span->set_source(tandem::v1::TOKEN_SOURCE_ENVIRONMENT);
         span->set_num_tokens(2);
       },
       invalid, "samples[1].source_spans give every token to the environment",
       "source_spans"},
      {"a NaN environment reward",
       [](Sample* s) {
         s->set_environment_reward(std::numeric_limits<double>::quiet_NaN());
       },
       invalid, "samples[1].environment_reward is nan", "episode"},
      {"an environment reward beyond any range",
       [](Sample* s) { s->set_environment_reward(2e6); }, invalid,
       "samples[1].environment_reward is 2e+06; an environment's reward must "
       "be finite and within [-1000000, 1000000]",
       "episode"},
      {"an unknown episode end reason",
       [](Sample* s) { s->set_episode_end_reason("because"); }, invalid,
       "samples[1].episode_end_reason is 'because', not a known end reason",
       "episode"},
      // Issue 25: a worker cannot reward a task that has no environment.
      {"an environment reward on a lease without an environment",
       [](Sample* s) {
         s->set_environment_reward(1.0);
         s->set_episode_end_reason("answered");
       },
       invalid, "samples[1].environment_reward is 1 but lease", "episode"},
      {"no lease id", [](Sample* s) { s->clear_lease_id(); }, invalid,
       "samples[1].lease_id is empty", "missing_lease"},
      {"too many tokens",
       [](Sample* s) {
         for (size_t i = 0; i <= kMaxCompletionTokens; ++i) {
           s->add_completion_token_ids(1);
         }
       },
       invalid,
       absl::StrCat("SubmitSamplesRequest.samples[1].completion_token_ids has ",
                    kMaxCompletionTokens + 3, " entries; the limit is ",
                    kMaxCompletionTokens),
       "too_large"},
      {"oversized sample id",
       [](Sample* s) { s->set_sample_id(std::string(40 << 20, 'x')); }, invalid,
       absl::StrCat("SubmitSamplesRequest.samples[1].sample_id is ", 40 << 20,
                    " bytes; the limit is ", kMaxIdBytes),
       "too_large"},
  };
}

TEST_CASE("submit_refuses_each_poisoned_sample_whole_and_stores_nothing") {
  Cluster cluster;
  for (int i = 0; i < 3; ++i) cluster.Publish();  // version 3
  const std::string worker = cluster.Register(tandem::v1::ROLE_ROLLOUT);
  // Dispatched at version 3 with max_lag 1: versions 2 (3 - max_lag) to 4
  // (published + 1) are allowed.
  const tandem::v1::PromptLease lease = cluster.Lease(worker);
  auto sample = [&](uint32_t index) {
    return MakeSample(lease.lease_id(), lease.group_id(), index, 3);
  };
  for (const Poison& p : Poisons()) {
    INFO(p.name);
    Sample bad = sample(1);
    p.poison(&bad);
    tandem::v1::SubmitSamplesResponse response;
    grpc::Status status = cluster.Submit(worker, {sample(0), bad}, &response);
    CHECK(status.error_code() == p.code);
    CHECK_THAT(status.error_message(), Catch::Contains(p.message));
    CHECK(cluster.Counter("tandem_coordinator_submit_refusals_total",
                          absl::StrCat("reason=\"", p.reason, "\"")) >= 1);
  }
  // Nothing was stored, not even the valid sample 0 of each call.
  tandem::v1::GetClusterStatusResponse status = cluster.Status();
  CHECK(status.counters().samples_received() == 0);
  CHECK(status.queues().scoring_samples() == 0);
  CHECK(status.queues().leased_prompts() == 1);
  CHECK(cluster.Counter("tandem_coordinator_oversized_requests_total",
                        "rpc=\"SubmitSamples\"") == 2);

  // Another member cannot deliver for this lease.
  const std::string other = cluster.Register(tandem::v1::ROLE_ROLLOUT);
  tandem::v1::SubmitSamplesResponse response;
  grpc::Status denied = cluster.Submit(other, {sample(0)}, &response);
  CHECK(denied.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK_THAT(
      denied.error_message(),
      Catch::Contains(absl::StrCat(
          "samples[0].lease_id '", lease.lease_id(), "' is held by member '",
          worker, "', not by the submitting member '", other, "'")));
  CHECK(cluster.Counter("tandem_coordinator_submit_refusals_total",
                        "reason=\"lease_not_held\"") == 1);

  // The holder's valid samples are accepted: one at the published version,
  // one that moved to the version the trainer is publishing (+1).
  Sample ahead = sample(1);
  ahead.mutable_version_spans(0)->set_num_tokens(1);
  auto* span = ahead.add_version_spans();
  span->set_policy_version(4);
  span->set_num_tokens(1);
  // A two-turn episode: the model's token, then the environment's.
  for (auto source : {tandem::v1::TOKEN_SOURCE_MODEL,
                      tandem::v1::TOKEN_SOURCE_ENVIRONMENT}) {
    auto* source_span = ahead.add_source_spans();
    source_span->set_source(source);
    source_span->set_num_tokens(1);
  }
  grpc::Status ok = cluster.Submit(worker, {sample(0), ahead}, &response);
  REQUIRE(ok.ok());
  CHECK(response.accepted() == 2);
  CHECK(cluster.Status().counters().samples_received() == 2);
}

TEST_CASE("a_worker_registered_again_after_a_restart_delivers_its_old_leases") {
  const std::string dir = absl::StrCat("/tmp/tandem-validation-", ::getpid(),
                                       "-", absl::ToUnixNanos(absl::Now()));
  std::string worker;
  tandem::v1::PromptLease lease;
  {
    Cluster first(dir);
    worker = first.Register(tandem::v1::ROLE_ROLLOUT);
    lease = first.Lease(worker);
  }
  // The restarted coordinator knows the lease (journal) but not the member.
  Cluster second(dir);
  const std::string stranger = second.Register(tandem::v1::ROLE_ROLLOUT);
  const std::string successor =
      second.Register(tandem::v1::ROLE_ROLLOUT, /*previous=*/worker);
  REQUIRE(stranger != worker);
  REQUIRE(successor != worker);
  auto samples =
      std::vector<Sample>{MakeSample(lease.lease_id(), lease.group_id(), 0, 0),
                          MakeSample(lease.lease_id(), lease.group_id(), 1, 0)};
  tandem::v1::SubmitSamplesResponse response;
  CHECK(second.Submit(stranger, samples, &response).error_code() ==
        grpc::StatusCode::PERMISSION_DENIED);
  REQUIRE(second.Submit(successor, samples, &response).ok());
  CHECK(response.accepted() == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("register_refuses_oversized_fields_and_leaves_status_intact") {
  Cluster cluster;
  const int members = cluster.Status().members_size();
  tandem::v1::RegisterRequest request;
  request.set_role(tandem::v1::ROLE_ROLLOUT);
  request.set_grpc_address("127.0.0.1:1");
  request.set_hostname(std::string(40 << 20, 'h'));
  grpc::Status status = cluster.TryRegister(request);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message() ==
        absl::StrCat("RegisterRequest.hostname is ", 40 << 20,
                     " bytes; the limit is ", kMaxHostnameBytes));

  request.set_hostname("ok");
  for (size_t i = 0; i <= kMaxCapabilities; ++i) {
    (*request.mutable_capabilities())[absl::StrCat("k", i)] = "v";
  }
  status = cluster.TryRegister(request);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(),
             Catch::Contains("RegisterRequest.capabilities has 65 entries"));

  request.clear_capabilities();
  (*request.mutable_capabilities())["verifiers"] = std::string(5000, 'v');
  status = cluster.TryRegister(request);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(),
             Catch::Contains("RegisterRequest.capabilities.value is 5000 "
                             "bytes; the limit is 4096"));

  CHECK(cluster.Status().members_size() == members);
  CHECK(cluster.Counter("tandem_coordinator_oversized_requests_total",
                        "rpc=\"Register\"") == 3);

  // The other RPCs check too.
  tandem::v1::SyncWeightGroupRequest sync;
  sync.set_member_id(cluster.trainer_id);
  sync.set_failure(std::string(kMaxReasonBytes + 1, 'f'));
  tandem::v1::SyncWeightGroupResponse sync_response;
  grpc::ClientContext context;
  status = cluster.stub->SyncWeightGroup(&context, sync, &sync_response);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(),
             Catch::Contains("SyncWeightGroupRequest.failure is 4097 bytes"));
}

// Calls `method` with a request whose member_id is one byte over its
// limit; the RPC's name (its request type's, less "Request") in `rpc`.
template <typename Request, typename Response>
grpc::Status CallWithOversizedId(
    tandem::v1::Coordinator::Stub* stub,
    grpc::Status (tandem::v1::Coordinator::Stub::*method)(
        grpc::ClientContext*, const Request&, Response*),
    std::string* rpc) {
  *rpc = Request::descriptor()->name();
  rpc->resize(rpc->size() - std::string("Request").size());
  Request request;
  request.set_member_id(std::string(kMaxIdBytes + 1, 'm'));
  Response response;
  grpc::ClientContext context;
  return (stub->*method)(&context, request, &response);
}

TEST_CASE(
    "every_rpc_that_names_a_member_refuses_an_oversized_member_id_counted_"
    "under_its_own_name") {
  Cluster cluster;
  using Stub = tandem::v1::Coordinator::Stub;
  Stub* stub = cluster.stub.get();
  std::vector<std::function<grpc::Status(std::string*)>> calls = {
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::Heartbeat, rpc);
      },
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::Deregister, rpc);
      },
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::LeasePrompts, rpc);
      },
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::RenewLeases, rpc);
      },
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::ReturnLeases, rpc);
      },
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::PullTrainingBatch, rpc);
      },
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::CommitTrainingBatch, rpc);
      },
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::ReleaseTrainingBatch, rpc);
      },
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::PublishPolicyVersion, rpc);
      },
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::ResumeTraining, rpc);
      },
      [&](std::string* rpc) {
        return CallWithOversizedId(stub, &Stub::SyncWeightGroup, rpc);
      },
  };
  for (const auto& call : calls) {
    std::string rpc;
    const grpc::Status status = call(&rpc);
    INFO(rpc << ": " << status.error_message());
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(status.error_message() ==
          absl::StrCat(rpc, "Request.member_id is ", kMaxIdBytes + 1,
                       " bytes; the limit is ", kMaxIdBytes));
    CHECK(cluster.Counter("tandem_coordinator_oversized_requests_total",
                          absl::StrCat("rpc=\"", rpc, "\"")) == 1);
  }
}

TEST_CASE("release_training_batch_checks_its_fields_and_names_what_is_wrong") {
  Cluster cluster;
  auto release = [&](const std::string& member, const std::string& batch,
                     const std::string& reason) {
    tandem::v1::ReleaseTrainingBatchRequest request;
    request.set_member_id(member);
    request.set_batch_id(batch);
    request.set_reason(reason);
    tandem::v1::ReleaseTrainingBatchResponse response;
    grpc::ClientContext context;
    return cluster.stub->ReleaseTrainingBatch(&context, request, &response);
  };
  grpc::Status status = release(cluster.trainer_id, "", "nan");
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(), Catch::Contains("batch_id is empty"));
  status = release(cluster.trainer_id, "b-none", std::string(5000, 'r'));
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(),
             Catch::Contains("ReleaseTrainingBatchRequest.reason is 5000 "
                             "bytes; the limit is 4096"));
  status = release(cluster.trainer_id, "b-none", "loss is not finite");
  CHECK(status.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK_THAT(status.error_message(), Catch::Contains("b-none"));
}

TEST_CASE("member_ids_of_a_restarted_coordinator_differ_from_every_old_one") {
  const std::string dir = absl::StrCat("/tmp/tandem-ids-", ::getpid(), "-",
                                       absl::ToUnixNanos(absl::Now()));
  std::set<std::string> old_ids;
  {
    Cluster first(dir);
    old_ids.insert(first.trainer_id);
    for (int i = 0; i < 3; ++i) {
      const std::string worker = first.Register(tandem::v1::ROLE_ROLLOUT);
      old_ids.insert(worker);
      first.Lease(worker);  // journaled under this member's id
      old_ids.insert(first.Register(tandem::v1::ROLE_VERIFIER));
    }
  }
  REQUIRE(old_ids.size() == 7);
  // Same journal, same order of registrations: none may reuse an old id
  // (the journal's leases still name them).
  Cluster second(dir);
  std::vector<std::string> new_ids = {second.trainer_id};
  for (int i = 0; i < 3; ++i) {
    new_ids.push_back(second.Register(tandem::v1::ROLE_ROLLOUT));
    new_ids.push_back(second.Register(tandem::v1::ROLE_VERIFIER));
  }
  for (const std::string& id : new_ids) {
    INFO(id);
    CHECK(old_ids.count(id) == 0);
  }
  // A heartbeat under an old id is refused, not taken for a new member's.
  tandem::v1::HeartbeatRequest heartbeat;
  heartbeat.set_member_id(*old_ids.begin());
  tandem::v1::HeartbeatResponse heartbeat_response;
  grpc::ClientContext context;
  CHECK(second.stub->Heartbeat(&context, heartbeat, &heartbeat_response)
            .error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  std::filesystem::remove_all(dir);
}

// Every string, repeated and map field reachable from `type`, by full name,
// with whether the table lists the limit its kind needs.
void CollectUnlimited(const google::protobuf::Descriptor& type,
                      std::set<std::string>* seen,
                      std::vector<std::string>* missing) {
  if (!seen->insert(type.full_name()).second) return;
  for (int i = 0; i < type.field_count(); ++i) {
    const google::protobuf::FieldDescriptor& field = *type.field(i);
    const std::optional<FieldLimits> limits = LimitsOf(field);
    const bool is_string =
        field.cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING;
    if (field.is_repeated() && !(limits && limits->max_entries)) {
      missing->push_back(field.full_name() + " (entries)");
    }
    if (is_string && !(limits && limits->max_bytes)) {
      missing->push_back(field.full_name() + " (bytes)");
    }
    if (field.message_type() != nullptr) {
      CollectUnlimited(*field.message_type(), seen, missing);
    }
  }
}

TEST_CASE("every_string_and_repeated_field_of_every_request_has_a_limit") {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "tandem.v1.Coordinator");
  REQUIRE(service != nullptr);
  std::set<std::string> seen;
  std::vector<std::string> missing;
  for (int i = 0; i < service->method_count(); ++i) {
    CollectUnlimited(*service->method(i)->input_type(), &seen, &missing);
  }
  CHECK(service->method_count() == 15);
  CHECK(missing == std::vector<std::string>{});
}

}  // namespace
}  // namespace tandem::coordinator
