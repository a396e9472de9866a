// HarnessEpisodes (services/rollout/harness_episodes.h) and its HTTP
// routes: offers, claims, turns that extend or do not extend the episode,
// the sample a finished group becomes (sources, log-probs, versions),
// finish twice, abort and idle expiry giving the lease back; on a fake
// clock, the 10 minute lifetime and the idle limit of turns that the routes
// stamp with HarnessOptions::clock.

#include <catch2/catch.hpp>

#include "services/rollout/harness_episodes.h"
#include "services/rollout/harness_routes.h"
#include "tests/support/fake_clock.h"

namespace tandem::rollout {
namespace {

using engine::TokenSource;

HarnessTask Task(const std::string& lease, int32_t group_size) {
  HarnessTask t;
  t.lease_id = lease;
  t.group_id = "g-" + lease;
  t.task_id = "row-1";
  t.prompt_text = "1+2=";
  t.prompt = {10, 11, 12};
  t.group_size = group_size;
  t.temperature = 0.7f;  // as a lease carries it (a float)
  t.metadata = {{"answer", "3"}};
  return t;
}

struct Fixture {
  uint64_t version = 5;
  HarnessEpisodes episodes{
      HarnessOptions{.idle_timeout = absl::Seconds(10), .max_episodes = 4},
      [this] { return version; }};
  absl::Time now = absl::FromUnixSeconds(1000);

  // One turn: `prompt` in, `tokens` out at `token_version`.
  absl::Status Turn(const std::string& id, const std::vector<int32_t>& prompt,
                    const std::vector<int32_t>& tokens, uint64_t token_version,
                    const std::string& request) {
    absl::Status s = episodes.BeginTurn(id, request, prompt, 0.7, now);
    if (!s.ok()) return s;
    std::vector<float> logprobs(tokens.size(), -0.5f);
    std::vector<uint64_t> versions(tokens.size(), token_version);
    episodes.EndTurn(id, request, tokens, logprobs, versions, "stop", now);
    return absl::OkStatus();
  }
};

TEST_CASE("a finished group becomes samples: model and environment tokens") {
  Fixture f;
  REQUIRE(f.episodes.Offer(Task("L1", 2), f.now).ok());
  std::optional<HarnessClaim> a = f.episodes.Claim(f.now);
  std::optional<HarnessClaim> b = f.episodes.Claim(f.now);
  REQUIRE(a);
  REQUIRE(b);
  CHECK_FALSE(f.episodes.Claim(f.now));
  CHECK(a->sample_index == 0);
  CHECK(b->sample_index == 1);
  CHECK(a->task.prompt == std::vector<int32_t>{10, 11, 12});

  // Turn 1 from the task's prompt; turn 2 adds two environment tokens.
  REQUIRE(f.Turn(a->episode_id, {10, 11, 12}, {20, 21}, 5, "r1").ok());
  f.version = 6;
  REQUIRE(
      f.Turn(a->episode_id, {10, 11, 12, 20, 21, 30, 31}, {22}, 6, "r2").ok());
  REQUIRE(f.episodes.Finish(a->episode_id, 1.0, f.now).ok());
  // The group waits for its other episode.
  CHECK(f.episodes.TakeFinishedGroups().empty());
  REQUIRE(f.Turn(b->episode_id, {10, 11, 12}, {40}, 6, "r3").ok());
  REQUIRE(f.episodes.Finish(b->episode_id, 0.0, f.now).ok());

  std::vector<std::vector<HarnessSample>> groups =
      f.episodes.TakeFinishedGroups();
  REQUIRE(groups.size() == 1);
  REQUIRE(groups[0].size() == 2);
  const engine::FinishedSample& s = groups[0][0].sample;
  CHECK(groups[0][0].reward == 1.0);
  CHECK(s.request_id == "L1");
  CHECK(s.sample_index == 0);
  CHECK(s.output == std::vector<int32_t>{20, 21, 30, 31, 22});
  CHECK(s.logprobs == std::vector<float>{-0.5f, -0.5f, 0.0f, 0.0f, -0.5f});
  CHECK(s.source_spans ==
        std::vector<engine::SourceSpan>{{TokenSource::kModel, 2},
                                        {TokenSource::kEnvironment, 2},
                                        {TokenSource::kModel, 1}});
  // The environment's tokens carry the live version at their turn.
  CHECK(s.spans == std::vector<engine::VersionSpan>{{5, 2}, {6, 3}});
  CHECK(s.turns == 2);
  CHECK(groups[0][1].sample.output == std::vector<int32_t>{40});
  CHECK(f.episodes.active() == 0);
  // Finished and submitted: a second finish names why.
  absl::Status again = f.episodes.Finish(a->episode_id, 1.0, f.now);
  CHECK(again.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(again.message()),
             Catch::Contains("finished with reward 1"));
}

TEST_CASE("a turn must extend the episode's tokens") {
  Fixture f;
  REQUIRE(f.episodes.Offer(Task("L1", 1), f.now).ok());
  const std::string id = f.episodes.Claim(f.now)->episode_id;
  // The task's prompt itself must be extended.
  absl::Status s = f.episodes.BeginTurn(id, "r0", {10, 99, 12}, 0.7, f.now);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(
      std::string(s.message()),
      Catch::Contains("differs at token position 1 ") && Catch::Contains(id));
  REQUIRE(f.Turn(id, {10, 11, 12}, {20, 21}, 5, "r1").ok());
  s = f.episodes.BeginTurn(id, "r2", {10, 11, 12, 20, 7}, 0.7, f.now);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("turn 2's prompt") &&
                 Catch::Contains("differs at token position 4 ") &&
                 Catch::Contains("the episode has token 21, the prompt 7"));
  s = f.episodes.BeginTurn(id, "r2", {10, 11, 12}, 0.7, f.now);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("differs at token position 3"));
  // Another temperature than the task's.
  s = f.episodes.BeginTurn(id, "r2", {10, 11, 12, 20, 21}, 1.0, f.now);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  // The refusals changed nothing: the right turn goes on.
  REQUIRE(
      f.episodes.BeginTurn(id, "r2", {10, 11, 12, 20, 21}, 0.7, f.now).ok());
  // One turn at a time; no finish during a turn.
  CHECK(
      f.episodes.BeginTurn(id, "r3", {10, 11, 12, 20, 21}, 0.7, f.now).code() ==
      absl::StatusCode::kFailedPrecondition);
  CHECK(f.episodes.Finish(id, 1.0, f.now).code() ==
        absl::StatusCode::kFailedPrecondition);
  // A cancelled turn records nothing.
  f.episodes.CancelTurn(id, "r2");
  REQUIRE(f.Turn(id, {10, 11, 12, 20, 21}, {22}, 5, "r4").ok());
  CHECK(f.episodes.Finish(id, 1.5, f.now).code() ==
        absl::StatusCode::kInvalidArgument);
  REQUIRE(f.episodes.Finish(id, 0.5, f.now).ok());
  auto groups = f.episodes.TakeFinishedGroups();
  REQUIRE(groups.size() == 1);
  CHECK(groups[0][0].sample.output == std::vector<int32_t>{20, 21, 22});
}

TEST_CASE("a task's reward_range bounds what :finish takes") {
  Fixture f;
  HarnessTask task = Task("L1", 1);
  task.reward_range = {-1.0, 1.0};
  REQUIRE(f.episodes.Offer(task, f.now).ok());
  std::optional<HarnessClaim> a = f.episodes.Claim(f.now);
  REQUIRE(a);
  REQUIRE(f.Turn(a->episode_id, {10, 11, 12}, {20}, 5, "r1").ok());
  absl::Status over = f.episodes.Finish(a->episode_id, 1.5, f.now);
  CHECK(over.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(over.message()),
             Catch::Contains("reward must be a number in [-1, 1] (the "
                             "task's range), got 1.5"));
  REQUIRE(f.episodes.Finish(a->episode_id, -0.75, f.now).ok());
  auto groups = f.episodes.TakeFinishedGroups();
  REQUIRE(groups.size() == 1);
  CHECK(groups[0][0].reward == -0.75);
}

TEST_CASE("unknown episodes, aborts and idle harnesses") {
  Fixture f;
  CHECK(f.episodes.BeginTurn("ep-x", "r", {1}, 0.7, f.now).code() ==
        absl::StatusCode::kNotFound);
  CHECK(f.episodes.Finish("ep-x", 1.0, f.now).code() ==
        absl::StatusCode::kNotFound);
  REQUIRE(f.episodes.Offer(Task("L1", 2), f.now).ok());
  REQUIRE(f.episodes.Offer(Task("L2", 2), f.now).ok());
  // Full: the worker takes no lease, and one offered is refused.
  CHECK(f.episodes.full());
  CHECK(f.episodes.Offer(Task("L3", 1), f.now).code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(f.episodes.Offer(Task("L1", 1), f.now).code() ==
        absl::StatusCode::kInvalidArgument);
  const std::string a = f.episodes.Claim(f.now)->episode_id;  // L1/0
  REQUIRE(f.Turn(a, {10, 11, 12}, {20}, 5, "r1").ok());
  REQUIRE(f.episodes.Finish(a, 1.0, f.now).ok());
  const std::string b = f.episodes.Claim(f.now)->episode_id;  // L1/1
  REQUIRE(f.episodes.Abort(b, "tool crashed").ok());
  auto back = f.episodes.TakeAbandoned(f.now);
  REQUIRE(back.size() == 1);
  CHECK(back[0].lease_id == "L1");
  CHECK_THAT(back[0].reason, Catch::Contains("tool crashed"));
  CHECK(back[0].why == HarnessReturn::kAborted);
  // Nothing of L1 is submitted, though one of its episodes finished.
  CHECK(f.episodes.TakeFinishedGroups().empty());
  CHECK(f.episodes.Finish(a, 1.0, f.now).code() ==
        absl::StatusCode::kFailedPrecondition);

  // L2: claimed, then the harness vanishes.
  const std::string c = f.episodes.Claim(f.now)->episode_id;
  REQUIRE(f.Turn(c, {10, 11, 12}, {20}, 5, "r2").ok());
  CHECK(f.episodes.TakeAbandoned(f.now + absl::Seconds(9)).empty());
  back = f.episodes.TakeAbandoned(f.now + absl::Seconds(10));
  REQUIRE(back.size() == 1);
  CHECK(back[0].lease_id == "L2");
  CHECK_THAT(back[0].reason, Catch::Contains("idle for"));
  CHECK(back[0].why == HarnessReturn::kIdleTimeout);
  CHECK(f.episodes.active() == 0);
  absl::Status late =
      f.episodes.BeginTurn(c, "r3", {10, 11, 12, 20}, 0.7, f.now);
  CHECK(late.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(late.message()),
             Catch::Contains("went back to the coordinator"));
  CHECK_FALSE(f.episodes.Claim(f.now));  // the dropped ones are not offered
}

TEST_CASE("a turn in flight is not idle; AbortAll returns every lease") {
  Fixture f;
  REQUIRE(f.episodes.Offer(Task("L1", 1), f.now).ok());
  const std::string id = f.episodes.Claim(f.now)->episode_id;
  REQUIRE(f.episodes.BeginTurn(id, "r1", {10, 11, 12}, 0.7, f.now).ok());
  CHECK(f.episodes.TakeAbandoned(f.now + absl::Hours(1)).empty());
  REQUIRE(f.episodes.Offer(Task("L2", 1), f.now).ok());
  // L3 finished, not yet taken: it goes back too.
  REQUIRE(f.episodes.Offer(Task("L3", 1), f.now).ok());
  f.episodes.Claim(f.now);
  const std::string l3 = f.episodes.Claim(f.now)->episode_id;
  REQUIRE(f.Turn(l3, {10, 11, 12}, {20}, 5, "r2").ok());
  REQUIRE(f.episodes.Finish(l3, 1.0, f.now).ok());
  std::vector<std::string> leases = f.episodes.AbortAll("shutdown");
  std::sort(leases.begin(), leases.end());
  CHECK(leases == std::vector<std::string>{"L1", "L2", "L3"});
  CHECK(f.episodes.TakeFinishedGroups().empty());
  CHECK(f.episodes.active() == 0);
}

TEST_CASE("an episode's lifetime bounds its lease, active harness or not") {
  HarnessEpisodes episodes(HarnessOptions{.idle_timeout = absl::Seconds(10),
                                          .max_lifetime = absl::Seconds(30),
                                          .max_episodes = 4},
                           [] { return uint64_t{1}; });
  absl::Time now = absl::FromUnixSeconds(1000);
  REQUIRE(episodes.Offer(Task("L1", 1), now).ok());
  const std::string id = episodes.Claim(now)->episode_id;
  // A turn every 8 s keeps it from idling; a turn in flight at 29 s too.
  std::vector<int32_t> context = {10, 11, 12};
  for (int turn = 1; turn <= 3; ++turn) {
    now += absl::Seconds(8);
    CHECK(episodes.TakeAbandoned(now).empty());
    const std::string request = "r" + std::to_string(turn);
    REQUIRE(episodes.BeginTurn(id, request, context, 0.7, now).ok());
    episodes.EndTurn(id, request, {20}, {-0.5f}, {1}, "stop", now);
    context.push_back(20);
  }
  REQUIRE(episodes.BeginTurn(id, "r4", context, 0.7, now).ok());
  CHECK(episodes.TakeAbandoned(now + absl::Seconds(5)).empty());  // 29 s
  auto back = episodes.TakeAbandoned(now + absl::Seconds(6));     // 30 s
  REQUIRE(back.size() == 1);
  CHECK(back[0].lease_id == "L1");
  CHECK(back[0].why == HarnessReturn::kLifetime);
  CHECK_THAT(back[0].reason, Catch::Contains("openai.harness_max_episode_s"));
  CHECK(episodes.active() == 0);
  // Its late response records nothing; the episode is gone.
  episodes.EndTurn(id, "r4", {21}, {-0.5f}, {1}, "stop", now);
  CHECK(episodes.Finish(id, 1.0, now).code() ==
        absl::StatusCode::kFailedPrecondition);
}

// A completion request of `episode_id`'s turn, as the HTTP layer parses it.
openai::CompletionRequest TurnRequest(const std::string& episode_id) {
  openai::CompletionRequest request;
  request.episode_id = episode_id;
  request.temperature = 0.7;
  return request;
}

// The response of a turn that sampled `token` at version 1.
openai::ChoiceResult TurnResult(int32_t token) {
  openai::ChoiceResult result;
  result.token_ids = {token};
  result.logprobs = {-0.5f};
  result.policy_versions = {1};
  result.finish_reason = "stop";
  return result;
}

TEST_CASE(
    "a 10 minute episode lifetime ends on the harness's clock, with turns "
    "through the routes stamped by it") {
  testing::FakeClock clock;
  HarnessEpisodes episodes(HarnessOptions{.idle_timeout = absl::Seconds(60),
                                          .max_lifetime = absl::Minutes(10),
                                          .max_episodes = 4,
                                          .clock = &clock},
                           [] { return uint64_t{1}; });
  const absl::Time offered = clock.Now();
  REQUIRE(episodes.Offer(Task("L1", 1), episodes.Now()).ok());
  HarnessReply claim = HandleHarnessRequest(
      &episodes, true, "/tandem/v1/episodes:claim", "{}", episodes.Now());
  REQUIRE(claim.status == 200);
  const std::string id = claim.body["episode_id"].get<std::string>();
  // A turn every 50 s through the routes (BeginEpisodeTurn, EndEpisodeTurn
  // read the clock): never idle for 60 s, up to 9 min 10 s.
  std::vector<int32_t> context = {10, 11, 12};
  for (int turn = 1; turn <= 11; ++turn) {
    clock.Advance(absl::Seconds(50));
    const std::string request = "r" + std::to_string(turn);
    REQUIRE_FALSE(
        BeginEpisodeTurn(&episodes, TurnRequest(id), request, context));
    EndEpisodeTurn(&episodes, id, request, TurnResult(20));
    context.push_back(20);
    CHECK(episodes.TakeAbandoned(episodes.Now()).empty());
  }
  // A turn that fails at 9 min 50 s (CancelTurn, also on the clock).
  clock.Advance(absl::Seconds(40));
  REQUIRE_FALSE(BeginEpisodeTurn(&episodes, TurnRequest(id), "r12", context));
  EndEpisodeTurn(&episodes, id, "r12", std::nullopt);
  // Not a millisecond before 10 minutes...
  clock.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  CHECK(episodes.TakeAbandoned(episodes.Now()).empty());
  CHECK(episodes.active() == 1);
  // ...and at 10 minutes the lease goes back.
  clock.Advance(absl::Milliseconds(1));
  REQUIRE(episodes.Now() - offered == absl::Minutes(10));
  std::vector<HarnessAbandoned> back = episodes.TakeAbandoned(episodes.Now());
  REQUIRE(back.size() == 1);
  CHECK(back[0].lease_id == "L1");
  CHECK(back[0].why == HarnessReturn::kLifetime);
  CHECK_THAT(back[0].reason, Catch::Contains("10m"));
  CHECK(episodes.active() == 0);
}

TEST_CASE(
    "a harness episode idles out on its clock from its last turn, a failed "
    "one included") {
  testing::FakeClock clock;
  HarnessEpisodes episodes(HarnessOptions{.idle_timeout = absl::Seconds(60),
                                          .max_episodes = 4,
                                          .clock = &clock},
                           [] { return uint64_t{1}; });
  REQUIRE(episodes.Offer(Task("L1", 1), episodes.Now()).ok());
  const std::optional<openai::Json> claimed = TryClaim(&episodes, episodes.Now());
  REQUIRE(claimed);
  const std::string id = (*claimed)["episode_id"].get<std::string>();
  clock.Advance(absl::Seconds(50));
  REQUIRE_FALSE(
      BeginEpisodeTurn(&episodes, TurnRequest(id), "r1", {10, 11, 12}));
  // The turn fails (the client went away): the episode was active at 50 s.
  EndEpisodeTurn(&episodes, id, "r1", std::nullopt);
  clock.Advance(absl::Seconds(60) - absl::Milliseconds(1));
  CHECK(episodes.TakeAbandoned(episodes.Now()).empty());
  clock.Advance(absl::Milliseconds(1));
  std::vector<HarnessAbandoned> back = episodes.TakeAbandoned(episodes.Now());
  REQUIRE(back.size() == 1);
  CHECK(back[0].why == HarnessReturn::kIdleTimeout);
  CHECK_THAT(back[0].reason, Catch::Contains("idle for 1m"));
}

TEST_CASE("counts by state and turns, for the metrics") {
  Fixture f;
  REQUIRE(f.episodes.Offer(Task("L1", 2), f.now).ok());
  REQUIRE(f.episodes.Offer(Task("L2", 1), f.now).ok());
  const std::string a = f.episodes.Claim(f.now)->episode_id;
  const std::string b = f.episodes.Claim(f.now)->episode_id;
  REQUIRE(f.Turn(a, {10, 11, 12}, {20}, 5, "r1").ok());
  REQUIRE(f.Turn(b, {10, 11, 12}, {20}, 5, "r2").ok());
  CHECK_FALSE(f.Turn(b, {10, 99}, {20}, 5, "r3").ok());  // does not extend
  REQUIRE(f.episodes.Finish(a, 1.0, f.now).ok());
  HarnessCounts counts = f.episodes.TakeCounts();
  CHECK(counts.unclaimed == 1);
  CHECK(counts.claimed == 1);
  CHECK(counts.finished == 1);
  CHECK(counts.turns_accepted == 2);
  CHECK(counts.turns_refused == 1);
  counts = f.episodes.TakeCounts();  // turns are since the last call
  CHECK(counts.turns_accepted == 0);
  CHECK(counts.turns_refused == 0);
  CHECK(counts.claimed == 1);
}

TEST_CASE("environment tokens never carry a version older than the last") {
  Fixture f;
  REQUIRE(f.episodes.Offer(Task("L1", 1), f.now).ok());
  const std::string id = f.episodes.Claim(f.now)->episode_id;
  // A turn with no token (aborted at once) is no model token.
  REQUIRE(f.Turn(id, {10, 11, 12}, {}, 5, "r1").ok());
  CHECK(f.episodes.Finish(id, 1.0, f.now).code() ==
        absl::StatusCode::kInvalidArgument);
  // The engine sampled at 7 while the published version still says 5.
  REQUIRE(f.Turn(id, {10, 11, 12}, {20}, 7, "r2").ok());
  REQUIRE(f.Turn(id, {10, 11, 12, 20, 30}, {21}, 7, "r3").ok());
  REQUIRE(f.episodes.Finish(id, 1.0, f.now).ok());
  auto groups = f.episodes.TakeFinishedGroups();
  REQUIRE(groups.size() == 1);
  CHECK(groups[0][0].sample.spans == std::vector<engine::VersionSpan>{{7, 3}});
}

TEST_CASE("the HTTP routes map onto the bookkeeping") {
  Fixture f;
  HarnessReply r = HandleHarnessRequest(nullptr, true,
                                        "/tandem/v1/episodes:claim", "", f.now);
  CHECK(r.status == 404);
  r = HandleHarnessRequest(&f.episodes, true, "/tandem/v1/episodes:claim",
                           R"({"wait_ms": 500})", f.now);
  CHECK(r.status == 204);
  CHECK(r.claim_wait == absl::Milliseconds(500));
  r = HandleHarnessRequest(&f.episodes, true, "/tandem/v1/episodes:claim",
                           R"({"wait_ms": -1})", f.now);
  CHECK(r.status == 400);
  REQUIRE(f.episodes.Offer(Task("L1", 1), f.now).ok());
  r = HandleHarnessRequest(&f.episodes, true, "/tandem/v1/episodes:claim", "",
                           f.now);
  REQUIRE(r.status == 200);
  const std::string id = r.body["episode_id"].get<std::string>();
  CHECK(r.body["lease_id"] == "L1");
  CHECK(r.body["prompt_token_ids"] == openai::Json({10, 11, 12}));
  CHECK(r.body["metadata"]["answer"] == "3");
  CHECK(std::abs(r.body["sampling"]["temperature"].get<double>() - 0.7) < 1e-6);
  const std::string finish = "/tandem/v1/episodes/" + id + ":finish";
  r = HandleHarnessRequest(&f.episodes, true, finish, R"({})", f.now);
  CHECK(r.status == 400);
  // No model turn yet: nothing to train on.
  r = HandleHarnessRequest(&f.episodes, true, finish, R"({"reward": 1})",
                           f.now);
  CHECK(r.status == 400);
  REQUIRE(f.Turn(id, {10, 11, 12}, {20}, 5, "r1").ok());
  r = HandleHarnessRequest(&f.episodes, true, finish, R"({"reward": 1})",
                           f.now);
  CHECK(r.status == 200);
  r = HandleHarnessRequest(&f.episodes, true, finish, R"({"reward": 1})",
                           f.now);
  CHECK(r.status == 409);
  CHECK(r.body["error"]["code"] == "episode_conflict");
  r = HandleHarnessRequest(&f.episodes, true,
                           "/tandem/v1/episodes/ep-nope:abort", "", f.now);
  CHECK(r.status == 404);
  r = HandleHarnessRequest(&f.episodes, true,
                           "/tandem/v1/episodes/" + id + ":pause", "", f.now);
  CHECK(r.status == 404);
  r = HandleHarnessRequest(&f.episodes, false, "/tandem/v1/episodes:claim", "",
                           f.now);
  CHECK(r.status == 405);
}

}  // namespace
}  // namespace tandem::rollout
