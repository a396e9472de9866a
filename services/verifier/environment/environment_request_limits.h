#pragma once

// Size limits (common/rpc/field_limits.h) on every string, repeated and map
// field of every request of tandem.v1.Environment, checked when a call
// arrives, before the episode table sees it: INVALID_ARGUMENT naming the
// field path, its size and the limit. They bound each field far above real
// use; the configured environment.max_action_bytes and max_tool_calls
// bound an action more tightly. verifier_environment_test checks that the
// table lists every such field.

#include "absl/status/status.h"
#include "common/rpc/field_limits.h"
#include "google/protobuf/message.h"

namespace tandem::verifier {

const rpc::FieldLimitsTable& EnvironmentRequestLimits();

absl::Status CheckEnvironmentRequestLimits(
    const google::protobuf::Message& request);

}  // namespace tandem::verifier
