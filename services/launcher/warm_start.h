#pragma once

// The demo's supervised warm start: runs `tandem-trainer sft` once for the
// built-in task and caches the resulting Hugging Face directory, so RL
// starts from a model that answers some problems. A later run with the same
// options finds the cached checkpoint (the sft command recognises its own
// finished output) and starts RL at once.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::launcher {

struct WarmStartOptions {
  // The tandem-trainer binary.
  std::string trainer_binary;
  // Cached checkpoint directory (created if missing).
  std::string output_dir;
  // The command's output is appended here as well.
  std::string log_path;
  // Flags after `tandem-trainer sft --output DIR`.
  std::vector<std::string> sft_flags;
};

// Default cache root: $TANDEM_CACHE_DIR, else $XDG_CACHE_HOME/tandem, else
// $HOME/.cache/tandem, else .cache/tandem.
std::string DefaultCacheRoot();

// Runs the warm start, passing each output line to `line_sink`. SIGINT,
// SIGTERM or SIGHUP (blocked in the caller, polled here) stop the child and
// return Cancelled. Returns the checkpoint directory; errors name the
// command, its exit status and the log file.
absl::StatusOr<std::string> RunWarmStart(
    const WarmStartOptions& options,
    const std::function<void(const std::string&)>& line_sink);

}  // namespace tandem::launcher
