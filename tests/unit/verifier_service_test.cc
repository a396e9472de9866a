// The verifier daemon in process, through its real gRPC surface: every
// sandbox escape attempt of issue 7 ends as reward 0 with a reason and the
// daemon keeps serving; malformed batches get INVALID_ARGUMENT naming the
// item and field; a full verifier answers RESOURCE_EXHAUSTED; the table of
// size limits covers every string, repeated and map field of every
// Verifier request.

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "services/verifier/request_limits.h"
#include "services/verifier/verifier.h"
#include "tandem/v1/verifier.grpc.pb.h"

namespace tandem::verifier {
namespace {

struct Daemon {
  std::unique_ptr<Verifier> verifier;
  std::unique_ptr<tandem::v1::Verifier::Stub> stub;

  explicit Daemon(int64_t max_concurrency = 64,
                  std::vector<std::string> verifiers = {}) {
    VerifierConfig config;
    config.verifiers = std::move(verifiers);
    config.server.metrics_address = "";
    // Nobody listens there: registration retries in the background, and
    // scoring does not depend on it.
    config.coordinator_address = "127.0.0.1:1";
    config.max_concurrency = max_concurrency;
    config.max_batch_items = std::min<int64_t>(64, max_concurrency);
    config.worker_threads = 2;
    config.code_cpu_seconds = 1;
    config.code_wall_seconds = 3.0;
    config.code_address_space_bytes = int64_t{256} << 20;
    config.code_max_output_bytes = 64 << 10;
    config.code_max_processes = 16;
    auto created = Verifier::Create(config);
    REQUIRE(created.ok());
    verifier = *std::move(created);
    REQUIRE(verifier->Start().ok());
    stub = tandem::v1::Verifier::NewStub(grpc::CreateChannel(
        verifier->grpc_address(), grpc::InsecureChannelCredentials()));
  }
  ~Daemon() { verifier->GracefulStop(absl::Seconds(10)); }

  grpc::Status Score(const tandem::v1::ScoreBatchRequest& request,
                     tandem::v1::ScoreBatchResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    return stub->ScoreBatch(&context, request, response);
  }
};

tandem::v1::ScoreItem CodeItem(const std::string& id,
                               const std::string& program) {
  tandem::v1::ScoreItem item;
  item.set_item_id(id);
  item.set_verifier("code");
  item.set_completion_text(program);
  nlohmann::json tests = nlohmann::json::array();
  tests.push_back({{"stdin", "1 2\n"}, {"expected_stdout", "3\n"}});
  (*item.mutable_metadata())["language"] = "python";
  (*item.mutable_metadata())["tests"] = tests.dump();
  return item;
}

constexpr char kGoodProgram[] =
    "a, b = map(int, input().split())\nprint(a + b)\n";

TEST_CASE(
    "Verifier service: each sandbox escape attempt scores 0 with a reason "
    "and the daemon keeps serving",
    "[verifier][escape]") {
  if (geteuid() != 0) {
    WARN("skipped: sandbox isolation needs root (CI runs it)");
    return;
  }
  Daemon daemon;
  tandem::v1::ScoreBatchRequest request;
  *request.add_items() = CodeItem("loop", "while True:\n    pass\n");
  *request.add_items() = CodeItem("fork_bomb",
                                  "import os\n"
                                  "while True:\n"
                                  "    try:\n"
                                  "        os.fork()\n"
                                  "    except OSError:\n"
                                  "        pass\n");
  *request.add_items() =
      CodeItem("memory_hog", "x = bytearray(1 << 34)\nprint(len(x))\n");
  *request.add_items() =
      CodeItem("huge_output", "while True:\n    print('x' * 4096)\n");
  *request.add_items() = CodeItem(
      "network",
      "import socket\n"
      "socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
      "print(3)\n");
  *request.add_items() = CodeItem(
      "escape_fs", "open('/tmp/tandem-escape', 'w').write('x')\nprint(3)\n");
  *request.add_items() = CodeItem("good", kGoodProgram);
  tandem::v1::ScoreBatchResponse response;
  grpc::Status status = daemon.Score(request, &response);
  REQUIRE(status.ok());
  REQUIRE(response.results_size() == request.items_size());
  std::map<std::string, tandem::v1::Score> scores;
  for (const auto& result : response.results()) {
    scores[result.item_id()] = result.score();
  }
  for (const char* id : {"loop", "fork_bomb", "memory_hog", "huge_output",
                         "network", "escape_fs"}) {
    INFO(id << ": " << scores[id].outcome() << ": " << scores[id].reason());
    CHECK(scores[id].reward() == 0.0);
    CHECK(!scores[id].reason().empty());
  }
  // Each outcome with its reason, shown with any failure below.
  std::string outcomes;
  for (const auto& [id, score] : scores) {
    outcomes += id + ": " + score.outcome() + ": " + score.reason() + "\n";
  }
  INFO(outcomes);
  CHECK(scores["loop"].outcome() == "timeout");
  CHECK(scores["fork_bomb"].outcome() == "timeout");
  CHECK((scores["memory_hog"].outcome() == "memory" ||
         scores["memory_hog"].outcome() == "runtime_error"));
  CHECK(scores["huge_output"].outcome() == "output_limit");
  CHECK(scores["network"].outcome() == "runtime_error");
  CHECK(absl::StrContains(scores["network"].reason(), "unreachable"));
  CHECK(scores["escape_fs"].outcome() == "runtime_error");
  CHECK(access("/tmp/tandem-escape", F_OK) != 0);
  CHECK(scores["good"].reward() == 1.0);

  // Still serving, right after.
  tandem::v1::ScoreBatchRequest again;
  *again.add_items() = CodeItem("good-again", kGoodProgram);
  tandem::v1::ScoreBatchResponse again_response;
  REQUIRE(daemon.Score(again, &again_response).ok());
  CHECK(again_response.results(0).score().reward() == 1.0);
}

TEST_CASE(
    "Verifier service: a malformed batch is INVALID_ARGUMENT naming the item "
    "and field, and nothing of it is scored",
    "[verifier][malformed]") {
  Daemon daemon;
  tandem::v1::ScoreBatchRequest request;
  tandem::v1::ScoreItem good;
  good.set_item_id("ok");
  good.set_verifier("exact");
  good.set_completion_text("42");
  (*good.mutable_metadata())["answer"] = "42";
  *request.add_items() = good;
  tandem::v1::ScoreItem unknown = good;
  unknown.set_verifier("nope");
  *request.add_items() = unknown;
  tandem::v1::ScoreBatchResponse response;
  grpc::Status status = daemon.Score(request, &response);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(absl::StrContains(status.error_message(), "items[1].verifier"));
  CHECK(response.results_size() == 0);

  tandem::v1::ScoreBatchRequest no_answer;
  tandem::v1::ScoreItem math = good;
  math.set_verifier("math");
  math.mutable_metadata()->clear();
  *no_answer.add_items() = math;
  status = daemon.Score(no_answer, &response);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(absl::StrContains(status.error_message(), "items[0]"));
  CHECK(absl::StrContains(status.error_message(), "metadata.answer"));

  tandem::v1::ScoreBatchRequest bad_tests;
  tandem::v1::ScoreItem code = CodeItem("c", kGoodProgram);
  (*code.mutable_metadata())["tests"] = "{not json";
  *bad_tests.add_items() = code;
  status = daemon.Score(bad_tests, &response);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(absl::StrContains(status.error_message(), "metadata.tests"));

  // The well-formed item alone is scored.
  tandem::v1::ScoreBatchRequest alone;
  *alone.add_items() = good;
  REQUIRE(daemon.Score(alone, &response).ok());
  CHECK(response.results(0).score().reward() == 1.0);
}

TEST_CASE(
    "Verifier service: past its concurrency limit it answers "
    "RESOURCE_EXHAUSTED and serves again once free",
    "[verifier][backpressure]") {
  if (geteuid() != 0) {
    WARN("skipped: the slow item runs in the sandbox, which needs root");
    return;
  }
  Daemon daemon(/*max_concurrency=*/2);
  tandem::v1::ScoreBatchRequest slow;
  *slow.add_items() = CodeItem("slow1", "import time\ntime.sleep(1.5)\n");
  *slow.add_items() = CodeItem("slow2", "import time\ntime.sleep(1.5)\n");
  grpc::Status slow_status;
  std::thread busy([&] {
    tandem::v1::ScoreBatchResponse response;
    slow_status = daemon.Score(slow, &response);
  });
  absl::SleepFor(absl::Milliseconds(300));
  tandem::v1::ScoreBatchRequest more;
  tandem::v1::ScoreItem item;
  item.set_item_id("more");
  item.set_verifier("exact");
  item.set_completion_text("1");
  (*item.mutable_metadata())["answer"] = "1";
  *more.add_items() = item;
  tandem::v1::ScoreBatchResponse response;
  grpc::Status status = daemon.Score(more, &response);
  CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  busy.join();
  CHECK(slow_status.ok());
  REQUIRE(daemon.Score(more, &response).ok());
  CHECK(response.results(0).score().reward() == 1.0);
}

TEST_CASE(
    "Verifier service: a batch over max_batch_items is RESOURCE_EXHAUSTED "
    "naming the limit, even when idle; a config whose max batch cannot be "
    "admitted is refused",
    "[verifier][backpressure]") {
  Daemon daemon(/*max_concurrency=*/4);  // max_batch_items 4
  tandem::v1::ScoreBatchRequest request;
  for (int i = 0; i < 5; ++i) {
    tandem::v1::ScoreItem* item = request.add_items();
    item->set_item_id(absl::StrCat("e", i));
    item->set_verifier("exact");
    item->set_completion_text("1");
    (*item->mutable_metadata())["answer"] = "1";
  }
  tandem::v1::ScoreBatchResponse response;
  grpc::Status status = daemon.Score(request, &response);
  CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(absl::StrContains(status.error_message(), "batch of 5 items"));
  CHECK(absl::StrContains(status.error_message(), "max_batch_items (4)"));
  request.mutable_items()->RemoveLast();
  REQUIRE(daemon.Score(request, &response).ok());
  REQUIRE(response.results_size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(response.results(i).item_id() == absl::StrCat("e", i));
    CHECK(response.results(i).score().reward() == 1.0);
  }

  VerifierConfig bad;
  bad.max_concurrency = 8;
  bad.max_batch_items = 9;
  const absl::Status invalid = Validate(bad);
  CHECK(absl::IsInvalidArgument(invalid));
  CHECK(absl::StrContains(invalid.message(), "max_batch_items (9)"));
  CHECK(absl::StrContains(invalid.message(), "max_concurrency (8)"));
}

TEST_CASE(
    "Verifier service: an item past item_timeout_ms scores 0 (timeout) with "
    "the limit named, and the other items of its batch are scored",
    "[verifier][deadline]") {
  if (geteuid() != 0) {
    WARN("skipped: the slow item runs in the sandbox, which needs root");
    return;
  }
  VerifierConfig config;
  config.server.metrics_address = "";
  config.coordinator_address = "127.0.0.1:1";
  config.worker_threads = 2;
  config.item_timeout_ms = 300;
  // Sandbox limits the sleeper never reaches: only item_timeout_ms ends it.
  config.code_cpu_seconds = 600;
  config.code_wall_seconds = 600;
  config.code_address_space_bytes = int64_t{256} << 20;
  auto created = Verifier::Create(config);
  REQUIRE(created.ok());
  std::unique_ptr<Verifier> verifier = *std::move(created);
  REQUIRE(verifier->Start().ok());
  auto stub = tandem::v1::Verifier::NewStub(grpc::CreateChannel(
      verifier->grpc_address(), grpc::InsecureChannelCredentials()));
  tandem::v1::ScoreBatchRequest request;
  *request.add_items() = CodeItem("sleeper", "import time\ntime.sleep(600)\n");
  tandem::v1::ScoreItem exact;
  exact.set_item_id("exact");
  exact.set_verifier("exact");
  exact.set_completion_text("1");
  (*exact.mutable_metadata())["answer"] = "1";
  *request.add_items() = exact;
  tandem::v1::ScoreBatchResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  REQUIRE(stub->ScoreBatch(&context, request, &response).ok());
  REQUIRE(response.results_size() == 2);
  const tandem::v1::Score& slept = response.results(0).score();
  INFO(slept.reason());
  CHECK(response.results(0).item_id() == "sleeper");
  CHECK(slept.reward() == 0.0);
  CHECK(slept.outcome() == "timeout");
  CHECK(absl::StrContains(slept.reason(), "item_timeout_ms of 300 ms"));
  CHECK(response.results(1).score().reward() == 1.0);
  verifier->GracefulStop(absl::Seconds(10));
}

TEST_CASE(
    "Verifier service: a replica serves only the verifiers it is configured "
    "with, and an unknown name in the config is refused",
    "[verifier][routing]") {
  VerifierConfig bad;
  bad.server.metrics_address = "";
  bad.verifiers = {"math", "nope"};
  auto refused = Verifier::Create(bad);
  REQUIRE(!refused.ok());
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK(absl::StrContains(refused.status().message(),
                          "verifiers: unknown verifier 'nope'"));

  Daemon daemon(/*max_concurrency=*/64, {"math"});
  {
    grpc::ClientContext context;
    tandem::v1::ListVerifiersResponse names;
    REQUIRE(daemon.stub->ListVerifiers(&context, {}, &names).ok());
    REQUIRE(names.names_size() == 1);
    CHECK(names.names(0) == "math");
  }
  tandem::v1::ScoreBatchRequest request;
  tandem::v1::ScoreItem item;
  item.set_item_id("e");
  item.set_verifier("exact");
  item.set_completion_text("1");
  (*item.mutable_metadata())["answer"] = "1";
  *request.add_items() = item;
  tandem::v1::ScoreBatchResponse response;
  grpc::Status status = daemon.Score(request, &response);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(absl::StrContains(status.error_message(), "unknown verifier 'exact'"));
  request.mutable_items(0)->set_verifier("math");
  (*request.mutable_items(0)->mutable_metadata())["answer"] = "1";
  REQUIRE(daemon.Score(request, &response).ok());
  CHECK(response.results(0).score().reward() == 1.0);
}

TEST_CASE("every_string_and_repeated_field_of_every_request_has_a_limit") {
  int methods = 0;
  const std::vector<std::string> missing = rpc::FieldsWithoutLimits(
      "tandem.v1.Verifier", VerifierRequestLimits(), &methods);
  CHECK(methods == 2);
  CHECK(missing == std::vector<std::string>{});
}

}  // namespace
}  // namespace tandem::verifier
