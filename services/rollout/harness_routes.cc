#include "services/rollout/harness_routes.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::rollout {
namespace {

using openai::ApiError;
using openai::Json;

constexpr std::string_view kPrefix = "/tandem/v1/episodes";

HarnessReply Error(ApiError error) {
  HarnessReply reply;
  reply.status = error.http_status;
  reply.body = openai::ErrorBody(error);
  return reply;
}

HarnessReply BadRequest(std::string message, std::string param = "") {
  return Error({.http_status = 400,
                .message = std::move(message),
                .param = std::move(param)});
}

// The body as a JSON object ("" is {}), or the error reply.
std::optional<Json> ParseBody(std::string_view body, HarnessReply* error) {
  if (body.empty()) return Json::object();
  Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    *error = BadRequest("the request body must be a JSON object");
    return std::nullopt;
  }
  return json;
}

Json ClaimJson(const HarnessClaim& claim, absl::Duration idle_timeout) {
  const HarnessTask& t = claim.task;
  Json metadata = Json::object();
  for (const auto& [key, value] : t.metadata) metadata[key] = value;
  Json sampling = {{"temperature", t.temperature}};
  if (t.max_tokens > 0) sampling["max_tokens"] = t.max_tokens;
  return {{"episode_id", claim.episode_id},
          {"group_id", t.group_id},
          {"lease_id", t.lease_id},
          {"sample_index", claim.sample_index},
          {"group_size", t.group_size},
          {"task_id", t.task_id},
          {"prompt", t.prompt_text},
          {"prompt_token_ids", t.prompt},
          {"verifier", t.verifier},
          {"metadata", std::move(metadata)},
          {"sampling", std::move(sampling)},
          {"idle_timeout_s", absl::ToDoubleSeconds(idle_timeout)}};
}

}  // namespace

bool IsHarnessPath(std::string_view path) {
  return path.substr(0, kPrefix.size()) == kPrefix;
}

ApiError HarnessError(const absl::Status& status) {
  ApiError error;
  error.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      error.http_status = 404;
      error.code = "episode_not_found";
      break;
    case absl::StatusCode::kFailedPrecondition:
      error.http_status = 409;
      error.code = "episode_conflict";
      break;
    case absl::StatusCode::kInvalidArgument:
      error.http_status = 400;
      break;
    default:
      error.http_status = 500;
      error.type = "server_error";
  }
  return error;
}

std::optional<ApiError> BeginEpisodeTurn(
    HarnessEpisodes* episodes, const openai::CompletionRequest& request,
    const std::string& request_id, const std::vector<int32_t>& prompt) {
  if (request.episode_id.empty()) return std::nullopt;
  if (episodes == nullptr) {
    return HarnessError(absl::NotFoundError(
        "this worker runs no harness episodes (openai.harness_environment "
        "is not set)"));
  }
  absl::Status turn =
      episodes->BeginTurn(request.episode_id, request_id, prompt,
                          request.temperature, episodes->Now());
  if (turn.ok()) return std::nullopt;
  return HarnessError(turn);
}

void EndEpisodeTurn(HarnessEpisodes* episodes, const std::string& episode_id,
                    const std::string& request_id,
                    const std::optional<openai::ChoiceResult>& result) {
  if (episodes == nullptr) return;
  if (!result) return episodes->CancelTurn(episode_id, request_id);
  episodes->EndTurn(episode_id, request_id, result->token_ids, result->logprobs,
                    result->policy_versions, result->finish_reason,
                    episodes->Now());
}

std::optional<Json> TryClaim(HarnessEpisodes* episodes, absl::Time now) {
  std::optional<HarnessClaim> claim = episodes->Claim(now);
  if (!claim) return std::nullopt;
  return ClaimJson(*claim, episodes->options().idle_timeout);
}

HarnessReply HandleHarnessRequest(HarnessEpisodes* episodes, bool is_post,
                                  std::string_view path, std::string_view body,
                                  absl::Time now) {
  if (episodes == nullptr) {
    return Error({.http_status = 404,
                  .message = "this worker runs no harness episodes "
                             "(openai.harness_environment is not set)"});
  }
  if (!is_post) {
    return Error({.http_status = 405, .message = "use POST here"});
  }
  HarnessReply error;
  std::optional<Json> json = ParseBody(body, &error);
  if (!json) return error;
  const std::string_view rest = path.substr(kPrefix.size());
  if (rest == ":claim") {
    int64_t wait_ms = 0;
    if (json->contains("wait_ms")) {
      const Json& w = (*json)["wait_ms"];
      if (!w.is_number_integer() || w.get<int64_t>() < 0 ||
          w.get<int64_t>() > absl::ToInt64Milliseconds(kMaxClaimWait)) {
        return BadRequest(
            absl::StrCat("'wait_ms' must be an integer in [0, ",
                         absl::ToInt64Milliseconds(kMaxClaimWait), "], got ",
                         openai::Dump(w).substr(0, 64)),
            "wait_ms");
      }
      wait_ms = w.get<int64_t>();
    }
    if (std::optional<Json> claimed = TryClaim(episodes, now)) {
      return {.status = 200, .body = std::move(*claimed)};
    }
    return {.status = 204, .claim_wait = absl::Milliseconds(wait_ms)};
  }
  // /{id}:finish or /{id}:abort
  const size_t colon = rest.rfind(':');
  if (rest.size() < 2 || rest[0] != '/' || colon == std::string_view::npos ||
      colon < 2) {
    return Error(
        {.http_status = 404,
         .message = absl::StrCat("no route ", std::string(path.substr(0, 256)),
                                 "; use POST /tandem/v1/episodes:claim, "
                                 "/tandem/v1/episodes/{id}:finish or "
                                 "/tandem/v1/episodes/{id}:abort")});
  }
  const std::string id(rest.substr(1, colon - 1));
  const std::string_view verb = rest.substr(colon + 1);
  absl::Status status;
  if (verb == "finish") {
    if (!json->contains("reward") || !(*json)["reward"].is_number()) {
      return BadRequest(
          absl::StrCat("episode ", id.substr(0, 128),
                       ": ':finish' needs a numeric 'reward' (in the task's "
                       "range, [0, 1] unless its dataset row gives a "
                       "reward_range)"),
          "reward");
    }
    status = episodes->Finish(id, (*json)["reward"].get<double>(), now);
  } else if (verb == "abort") {
    std::string reason = "no reason given";
    if (json->contains("reason") && (*json)["reason"].is_string()) {
      reason = (*json)["reason"].get<std::string>().substr(0, 512);
    }
    status = episodes->Abort(id, reason);
  } else {
    return Error({.http_status = 404,
                  .message = absl::StrCat("unknown episode action '",
                                          std::string(verb.substr(0, 64)),
                                          "'; use :finish or :abort")});
  }
  if (!status.ok()) return Error(HarnessError(status));
  return {.status = 200,
          .body = {{"episode_id", id},
                   {"status", verb == "finish" ? "finished" : "aborted"}}};
}

}  // namespace tandem::rollout
