#include "engine/sequence.h"

namespace tandem::engine {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "aborted";
    default:
      return "none";
  }
}

void Sequence::Append(int32_t token, float logprob, uint64_t version) {
  output.push_back(token);
  logprobs.push_back(logprob);
  if (spans.empty() || spans.back().policy_version != version) {
    spans.push_back({version, 0});
  }
  ++spans.back().num_tokens;
  if (!sources.empty()) {
    if (sources.back().source != TokenSource::kModel) {
      sources.push_back({TokenSource::kModel, 0});
    }
    ++sources.back().num_tokens;
  }
}

void Sequence::AppendEnvironment(const std::vector<int32_t>& tokens) {
  if (tokens.empty()) return;
  if (sources.empty() && !output.empty()) {
    sources.push_back(
        {TokenSource::kModel, static_cast<uint32_t>(output.size())});
  }
  // The first turn has always sampled a token before a park, so spans is
  // not empty; the fallback keeps the invariant if it ever were.
  const uint64_t version = spans.empty() ? 0 : spans.back().policy_version;
  if (spans.empty()) spans.push_back({version, 0});
  output.insert(output.end(), tokens.begin(), tokens.end());
  logprobs.insert(logprobs.end(), tokens.size(), 0.0f);
  spans.back().num_tokens += static_cast<uint32_t>(tokens.size());
  if (sources.empty() || sources.back().source != TokenSource::kEnvironment) {
    sources.push_back({TokenSource::kEnvironment, 0});
  }
  sources.back().num_tokens += static_cast<uint32_t>(tokens.size());
  turn_start = static_cast<int32_t>(output.size());
}

}  // namespace tandem::engine
