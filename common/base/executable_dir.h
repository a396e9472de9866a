#pragma once

// The directory of the running executable (from /proc/self/exe), where
// Tandem's binaries find their siblings (build/bin, /usr/local/bin in the
// images); "." when it cannot be read.

#include <string>

namespace tandem {

std::string ExecutableDir();

}  // namespace tandem
