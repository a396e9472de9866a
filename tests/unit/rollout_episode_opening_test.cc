// Opening observations (docs/environments.md, "Opening observations"):
// EpisodeDriver on the engine over the toy model, against the tests' own
// environment on loopback that opens each episode with a user observation.
// The codec renders it as the rig's stand-in template would (each message
// as Render, then the header kHeader) after a prompt without kHeader; a
// prompt with it starts at once, as before.

#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "services/rollout/episode_driver.h"
#include "tests/support/wait_for.h"
#include "tests/unit/episode_driver_rig.h"

namespace tandem::rollout {
namespace {

using namespace test;  // NOLINT: the rig's names
using tandem::testing::WaitFor;

// `r` begins with `opening` as the environment's (log-prob 0), then the
// model's tokens.
void CheckOpening(const EpisodeResult& r, const std::vector<int32_t>& opening) {
  REQUIRE(r.sample.output.size() > opening.size());
  CHECK(std::vector<int32_t>(r.sample.output.begin(),
                             r.sample.output.begin() +
                                 static_cast<std::ptrdiff_t>(opening.size())) ==
        opening);
  REQUIRE(r.sample.source_spans.size() >= 2);
  CHECK(r.sample.source_spans[0] ==
        engine::SourceSpan{engine::TokenSource::kEnvironment,
                           static_cast<uint32_t>(opening.size())});
  CHECK(r.sample.source_spans[1].source == engine::TokenSource::kModel);
  for (size_t k = 0; k < opening.size(); ++k) {
    CHECK(r.sample.logprobs[k] == 0.0f);
  }
  // The model's first token has a real log-prob (the toy model is not
  // certain of anything).
  CHECK(r.sample.logprobs[opening.size()] < 0.0f);
}

std::vector<int32_t> OpeningFor(const std::string& content) {
  tandem::v1::Observation o;
  o.set_role("user");
  o.set_content(content);
  return RenderOpening({o});
}

TEST_CASE(
    "opening observations come before the first model token as the "
    "environment's, each sample its own, after a prompt without the "
    "generation header") {
  RewardingEnvironment service;
  service.opening_observation = true;
  service.numbered_opening = true;
  service.reward = 1.0;
  LoopbackServer server(&service);
  Rig rig(server.address(), EpisodeLimits{}, {}, {}, /*openings=*/true);
  rig.script = {"7", "7"};
  REQUIRE(rig.Start("rooms", 3, {}, {3, 4, 5, 6, 7}, /*n=*/2).ok());
  std::vector<EpisodeResult> results;
  results.push_back(rig.RunOne());
  results.push_back(rig.RunOne());
  std::set<std::vector<int32_t>> openings;
  for (const EpisodeResult& r : results) {
    CHECK(r.end_reason == "environment");
    REQUIRE(r.reward.has_value());
    CHECK(*r.reward == 1.0);
    CHECK(r.sample.prompt == std::vector<int32_t>{3, 4, 5, 6, 7});
    CHECK(r.sample.turns == 1);
    // Which sample's open answered first is up to the server.
    const std::vector<int32_t> one = OpeningFor("You are in room 1");
    const std::vector<int32_t> two = OpeningFor("You are in room 2");
    const std::vector<int32_t>& mine =
        std::equal(one.begin(), one.end(), r.sample.output.begin()) ? one : two;
    CheckOpening(r, mine);
    openings.insert(mine);
    // The sample's version spans cover the opening too.
    uint32_t covered = 0;
    for (const engine::VersionSpan& v : r.sample.spans) covered += v.num_tokens;
    CHECK(covered == r.sample.output.size());
  }
  CHECK(openings.size() == 2);
}

TEST_CASE(
    "no opening observations: a prompt with the generation header gives the "
    "same tokens as a worker without openings; one without it gets the "
    "header as the environment's") {
  RewardingEnvironment service;  // no opening observations
  service.reward = 1.0;
  LoopbackServer server(&service);
  const std::vector<int32_t> ready = {3, 4, 5, kHeader[0], kHeader[1]};
  EpisodeResult before, after, bare;
  {
    Rig rig(server.address(), EpisodeLimits{});
    rig.script = {"7"};
    REQUIRE(rig.Start("plain", 3, {}, ready).ok());
    before = rig.RunOne();
  }
  {
    Rig rig(server.address(), EpisodeLimits{}, {}, {}, /*openings=*/true);
    rig.script = {"7", "7"};
    REQUIRE(rig.Start("plain", 3, {}, ready).ok());
    after = rig.RunOne();
    REQUIRE(rig.Start("headless", 3, {}, {3, 4, 5}).ok());
    bare = rig.RunOne();
  }
  CHECK(before.end_reason == "environment");
  CHECK(after.end_reason == "environment");
  CHECK(after.sample.output == before.sample.output);
  CHECK(after.sample.logprobs == before.sample.logprobs);
  CHECK(after.sample.source_spans.empty());
  CHECK(bare.end_reason == "environment");
  CheckOpening(bare, kHeader);
}

TEST_CASE(
    "an opening too large for max_episode_tokens ends observation_too_large "
    "at the first turn, which did not see it; a failed open ends "
    "environment_failed") {
  RewardingEnvironment service;
  service.opening_observation = true;  // 18 bytes: 1 + 18 + 2 tokens
  service.reward = 1.0;
  LoopbackServer server(&service);
  EpisodeLimits limits;
  limits.max_episode_tokens = 21;
  {
    Rig rig(server.address(), limits, {}, {}, /*openings=*/true);
    rig.script = {"7"};
    REQUIRE(rig.Start("vast", 3).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.end_reason == "observation_too_large");
    CHECK_THAT(r.end_text, Catch::Contains("21 tokens (with the generation "
                                           "header), which leave no room in "
                                           "max_episode_tokens 21"));
    // Not the observation: the generation header alone, then one turn
    // (a completion is never empty), and no step was sent.
    CheckOpening(r, kHeader);
    CHECK(r.sample.turns == 1);
    CHECK(rig.decoded.empty());
    CHECK_FALSE(r.reward.has_value());
    CHECK(WaitFor(
        [&] {
          rig.driver.Poll();
          return service.closed >= 1;
        },
        absl::Seconds(10)));
    CHECK(service.closed == 1);
  }
  {
    // One token more leaves room for a one-token turn.
    limits.max_episode_tokens = 22;
    Rig rig(server.address(), limits, {}, {}, /*openings=*/true);
    rig.script = {"7"};
    REQUIRE(rig.Start("snug", 3).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.end_reason == "environment");
    CheckOpening(r, OpeningFor("You are in a maze."));
    CHECK(r.sample.output.size() == 22);
  }
  {
    EnvironmentClientOptions options;
    options.open_timeout = absl::Milliseconds(300);
    Rig rig("127.0.0.1:1", EpisodeLimits{}, options, {}, /*openings=*/true);
    REQUIRE(rig.Start("nobody", 3).ok());
    EpisodeResult r = rig.RunOne();
    CHECK(r.end_reason == "environment_failed");
    CHECK_THAT(r.end_text, Catch::Contains("OpenEpisode"));
    CheckOpening(r, kHeader);
    CHECK(rig.decoded.empty());
  }
}

TEST_CASE(
    "opening observations after a prompt that ends with the generation "
    "header are refused, naming the fix") {
  RewardingEnvironment service;
  service.opening_observation = true;
  service.reward = 1.0;
  LoopbackServer server(&service);
  Rig rig(server.address(), EpisodeLimits{}, {}, {}, /*openings=*/true);
  rig.script = {"7"};
  REQUIRE(rig.Start("late", 3, {}, {3, 4, 5, kHeader[0], kHeader[1]}).ok());
  EpisodeResult r = rig.RunOne();
  CHECK(r.end_reason == "environment_failed");
  CHECK_THAT(r.end_text,
             Catch::Contains("write the prompts of this environment without "
                             "the generation header"));
  CHECK_FALSE(r.reward.has_value());
}

TEST_CASE(
    "AbortUnstarted gives back a task still waiting for its opens and "
    "closes its episodes") {
  HangingEnvironment service;  // opens as "hang-1", counts its closes
  LoopbackServer server(&service);
  Rig rig(server.address(), EpisodeLimits{}, {}, {}, /*openings=*/true);
  REQUIRE(rig.Start("waiting", 3, {}, {3, 4, 5}, /*n=*/2).ok());
  // The open replies are taken only by Poll: the task has not started.
  CHECK(rig.driver.active() == 2);
  CHECK(rig.engine.idle());
  CHECK(rig.driver.AbortUnstarted() == std::vector<std::string>{"waiting"});
  CHECK(rig.driver.active() == 0);
  CHECK(rig.driver.AbortUnstarted().empty());
  // Both opens answer later; their episodes are closed then.
  CHECK(WaitFor(
      [&] {
        rig.driver.Poll();
        return service.closes >= 2;
      },
      absl::Seconds(10)));
  CHECK(service.closes == 2);
  CHECK(rig.engine.idle());
}

}  // namespace
}  // namespace tandem::rollout
