#include "services/coordinator/group_state.h"

#include <algorithm>

namespace tandem::coordinator {

tandem::v1::ScoredGroup ToScoredGroup(const GroupState& group) {
  tandem::v1::ScoredGroup out;
  out.set_group_id(group.group_id);
  out.set_prompt_id(group.prompt->id);
  out.mutable_prompt_token_ids()->Add(group.prompt->token_ids.begin(),
                                      group.prompt->token_ids.end());
  out.mutable_reference_completion_ids()->Add(
      group.prompt->reference_completion_ids.begin(),
      group.prompt->reference_completion_ids.end());
  for (size_t i = 0; i < group.samples.size(); ++i) {
    tandem::v1::ScoredSample* scored = out.add_samples();
    if (group.samples[i]) *scored->mutable_sample() = *group.samples[i];
    if (group.scores[i]) *scored->mutable_score() = *group.scores[i];
  }
  out.set_min_policy_version(group.min_version);
  out.set_max_policy_version(group.max_version);
  return out;
}

void ComputeVersionRange(GroupState* group) {
  uint64_t lo = UINT64_MAX;
  uint64_t hi = 0;
  for (const auto& sample : group->samples) {
    if (!sample) continue;
    bool any = false;
    for (const auto& span : sample->version_spans()) {
      if (span.num_tokens() == 0) continue;
      lo = std::min<uint64_t>(lo, span.policy_version());
      hi = std::max<uint64_t>(hi, span.policy_version());
      any = true;
    }
    if (!any) {
      lo = std::min(lo, group->worker_version);
      hi = std::max(hi, group->worker_version);
    }
  }
  if (lo == UINT64_MAX) lo = hi = group->worker_version;
  group->min_version = lo;
  group->max_version = hi;
}

journal::Prompt ToJournal(const Prompt& prompt) {
  journal::Prompt out;
  out.set_id(prompt.id);
  out.set_text(prompt.text);
  out.mutable_token_ids()->Add(prompt.token_ids.begin(),
                               prompt.token_ids.end());
  out.set_verifier(prompt.verifier);
  for (const auto& [key, value] : prompt.metadata) {
    (*out.mutable_metadata())[key] = value;
  }
  out.set_environment(prompt.environment);
  if (!prompt.environment.empty()) {
    out.set_reward_min(prompt.reward_range.min);
    out.set_reward_max(prompt.reward_range.max);
  }
  out.mutable_reference_completion_ids()->Add(
      prompt.reference_completion_ids.begin(),
      prompt.reference_completion_ids.end());
  return out;
}

Prompt FromJournal(const journal::Prompt& prompt) {
  Prompt out;
  out.id = prompt.id();
  out.text = prompt.text();
  out.token_ids.assign(prompt.token_ids().begin(), prompt.token_ids().end());
  out.verifier = prompt.verifier();
  for (const auto& [key, value] : prompt.metadata()) out.metadata[key] = value;
  out.environment = prompt.environment();
  if (prompt.has_reward_min()) out.reward_range.min = prompt.reward_min();
  if (prompt.has_reward_max()) out.reward_range.max = prompt.reward_max();
  out.reference_completion_ids.assign(
      prompt.reference_completion_ids().begin(),
      prompt.reference_completion_ids().end());
  return out;
}

journal::Group ToJournal(const GroupState& group) {
  journal::Group out;
  out.set_group_id(group.group_id);
  out.set_lease_id(group.lease_id);
  out.set_member_id(group.member_id);
  *out.mutable_prompt() = ToJournal(*group.prompt);
  out.set_lease_deadline_unix_ms(absl::ToUnixMillis(group.lease_deadline));
  out.set_dispatch_version(group.dispatch_version);
  out.set_worker_version(group.worker_version);
  for (size_t i = 0; i < group.samples.size(); ++i) {
    if (group.samples[i]) *out.add_samples() = *group.samples[i];
    if (group.scores[i]) {
      journal::IndexedScore* score = out.add_scores();
      score->set_index(static_cast<uint32_t>(i));
      *score->mutable_score() = *group.scores[i];
    }
  }
  out.set_min_version(group.min_version);
  out.set_max_version(group.max_version);
  return out;
}

std::unique_ptr<GroupState> FromJournal(const journal::Group& group,
                                        uint32_t group_size) {
  auto out = std::make_unique<GroupState>();
  out->group_id = group.group_id();
  out->lease_id = group.lease_id();
  out->member_id = group.member_id();
  out->prompt = std::make_shared<const Prompt>(FromJournal(group.prompt()));
  out->lease_deadline = absl::FromUnixMillis(group.lease_deadline_unix_ms());
  out->dispatch_version = group.dispatch_version();
  out->worker_version = group.worker_version();
  uint32_t size = group_size;
  for (const auto& sample : group.samples()) {
    size = std::max(size, sample.sample_index() + 1);
  }
  out->samples.resize(size);
  out->scores.resize(size);
  for (const auto& sample : group.samples()) {
    if (out->samples[sample.sample_index()]) continue;
    out->samples[sample.sample_index()] = sample;
    ++out->submitted;
    out->tokens +=
        out->prompt->token_ids.size() + sample.completion_token_ids_size();
  }
  for (const auto& score : group.scores()) {
    if (score.index() >= size || out->scores[score.index()]) continue;
    out->scores[score.index()] = score.score();
    ++out->scored;
  }
  out->min_version = group.min_version();
  out->max_version = group.max_version();
  return out;
}

}  // namespace tandem::coordinator
