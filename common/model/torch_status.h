#pragma once

// Turning LibTorch exceptions into absl::Status at the model's boundary.
// Internal to common/model.

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tandem::model::internal {

// InternalError "<what>: <LibTorch message without backtrace>";
// ResourceExhausted for allocation failures.
inline absl::Status TorchErrorToStatus(absl::string_view what,
                                       const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return absl::InternalError(
        absl::StrCat(what, ": ", c10_error->what_without_backtrace()));
  }
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  }
  return absl::InternalError(absl::StrCat(what, ": ", e.what()));
}

}  // namespace tandem::model::internal
