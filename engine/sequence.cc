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
}

}  // namespace tandem::engine
