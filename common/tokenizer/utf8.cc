#include "common/tokenizer/utf8.h"

#include <utf8proc.h>

namespace tandem::tokenizer {

std::string ToValidUtf8(absl::string_view bytes) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  const auto* data = reinterpret_cast<const utf8proc_uint8_t*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    utf8proc_int32_t codepoint = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(
        data + i, static_cast<utf8proc_ssize_t>(bytes.size() - i), &codepoint);
    if (n > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else {
      out.append(kReplacement);
      ++i;
    }
  }
  return out;
}

}  // namespace tandem::tokenizer
