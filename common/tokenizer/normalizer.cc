#include "common/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "common/tokenizer/byte_level.h"

namespace tandem::tokenizer {
namespace {

// Code points below U+0300 are NFC-stable and never combine with a
// neighbour; every UTF-8 sequence for U+0300 and above starts with a byte
// >= 0xCC. Text without such a byte is already in NFC.
bool MayNeedNfc(absl::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0xCC) return true;
  }
  return false;
}

void AppendNfcOfValidRun(absl::string_view run, std::string* out) {
  if (!MayNeedNfc(run)) {
    out->append(run.data(), run.size());
    return;
  }
  utf8proc_uint8_t* mapped = nullptr;
  utf8proc_ssize_t len = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
      static_cast<utf8proc_ssize_t>(run.size()), &mapped,
      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) {
    // Cannot happen for a validated run; keep the text rather than lose it.
    out->append(run.data(), run.size());
  } else {
    out->append(reinterpret_cast<const char*>(mapped),
                static_cast<size_t>(len));
  }
  std::free(mapped);
}

}  // namespace

std::string NfcNormalize(absl::string_view text) {
  std::string out;
  if (!MayNeedNfc(text)) {
    out.assign(text.data(), text.size());
    return out;
  }
  out.reserve(text.size());
  size_t run_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp;
    int len = DecodeUtf8(text.substr(pos), &cp);
    if (len > 0) {
      pos += len;
      continue;
    }
    AppendNfcOfValidRun(text.substr(run_start, pos - run_start), &out);
    out.push_back(text[pos]);
    ++pos;
    run_start = pos;
  }
  AppendNfcOfValidRun(text.substr(run_start), &out);
  return out;
}

bool IsUnicodeWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool IsUnicodeWordCharacter(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') ||
           (cp >= 'A' && cp <= 'Z') || cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace tandem::tokenizer
