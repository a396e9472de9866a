#include "common/tokenizer/byte_level.h"

namespace tandem::tokenizer {
namespace {

struct ByteTables {
  std::array<char32_t, 256> byte_to_cp;
  // Indexed by code point; every byte character is below U+0144.
  std::array<int16_t, 0x144> cp_to_byte;
};

ByteTables BuildTables() {
  ByteTables tables;
  tables.cp_to_byte.fill(-1);
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
           (b >= 0xAE && b <= 0xFF);
  };
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    char32_t cp = printable(b) ? static_cast<char32_t>(b)
                               : static_cast<char32_t>(256 + next_extra++);
    tables.byte_to_cp[b] = cp;
    tables.cp_to_byte[cp] = static_cast<int16_t>(b);
  }
  return tables;
}

const ByteTables& Tables() {
  static const ByteTables* const tables = new ByteTables(BuildTables());
  return *tables;
}

}  // namespace

char32_t ByteToCodePoint(uint8_t byte) { return Tables().byte_to_cp[byte]; }

std::optional<uint8_t> CodePointToByte(char32_t cp) {
  if (cp >= Tables().cp_to_byte.size()) return std::nullopt;
  int16_t b = Tables().cp_to_byte[cp];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int DecodeUtf8(absl::string_view text, char32_t* cp) {
  if (text.empty()) return 0;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  unsigned char c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  int len;
  char32_t value;
  char32_t min_value;
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    value = c & 0x1F;
    min_value = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    value = c & 0x0F;
    min_value = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    value = c & 0x07;
    min_value = 0x10000;
  } else {
    return 0;
  }
  if (n < static_cast<size_t>(len)) return 0;
  for (int i = 1; i < len; ++i) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    value = (value << 6) | (s[i] & 0x3F);
  }
  if (value < min_value || value > 0x10FFFF ||
      (value >= 0xD800 && value <= 0xDFFF)) {
    return 0;
  }
  *cp = value;
  return len;
}

void AppendByteLevelEncoded(absl::string_view bytes, std::string* out) {
  const ByteTables& tables = Tables();
  for (char c : bytes) {
    AppendUtf8(tables.byte_to_cp[static_cast<uint8_t>(c)], out);
  }
}

std::string ByteLevelEncode(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  AppendByteLevelEncoded(bytes, &out);
  return out;
}

std::optional<std::string> ByteLevelDecode(absl::string_view token) {
  std::string out;
  out.reserve(token.size());
  while (!token.empty()) {
    char32_t cp;
    int len = DecodeUtf8(token, &cp);
    if (len == 0) return std::nullopt;
    std::optional<uint8_t> byte = CodePointToByte(cp);
    if (!byte.has_value()) return std::nullopt;
    out.push_back(static_cast<char>(*byte));
    token.remove_prefix(len);
  }
  return out;
}

}  // namespace tandem::tokenizer
