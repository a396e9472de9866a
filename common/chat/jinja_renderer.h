#pragma once

// Renders a parsed chat template against a context of global variables.
// Rendering is bounded: output size, evaluation steps and macro call depth
// have limits, so no template or context can hang or exhaust memory.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/value.h"

namespace tandem::chat {

struct RenderLimits {
  size_t max_output_bytes = 16u << 20;
  int64_t max_steps = 20'000'000;
  int max_call_depth = 64;
  // Nested evaluations (expressions, blocks, macro bodies) at once: bounds
  // the renderer's stack use (about 1 MiB at this limit) on any thread.
  int max_eval_depth = 1000;
  // Lists and dicts nested deeper than this (in the context or built by the
  // template) are an error: printing and freeing them recurse.
  int max_value_depth = 256;
};

// `globals` must be a dict. Errors name `template_name`, line and column.
absl::StatusOr<std::string> RenderTemplate(const NodeList& nodes, const Value& globals,
                                           std::string_view template_name,
                                           const RenderLimits& limits);

}  // namespace tandem::chat
