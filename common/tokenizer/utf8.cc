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

size_t CompleteUtf8Length(absl::string_view bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) {
      need = 2;
    } else if ((c & 0xF0) == 0xE0) {
      need = 3;
    } else if ((c & 0xF8) == 0xF0) {
      need = 4;
    }
    return back < need ? n - back : n;
  }
  return n;
}

}  // namespace tandem::tokenizer
