// Python str methods over UTF-8 strings, for the filters and methods in
// jinja_builtins.cc.

#include "common/chat/jinja_builtins.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace tandem::chat::internal {

namespace {

[[noreturn]] void Fail(std::string what) { throw BuiltinError{std::move(what)}; }

}  // namespace

bool IsPySpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto strip_char = [&](char c) {
    if (chars.is_undefined() || chars.is_none()) return IsPySpace(c);
    return chars.as_string().find(c) != std::string::npos;
  };
  if (!chars.is_undefined() && !chars.is_none() && !chars.is_string()) Fail("strip chars must be a str");
  size_t b = 0, e = s.size();
  if (left) while (b < e && strip_char(s[b])) ++b;
  if (right) while (e > b && strip_char(s[e - 1])) --e;
  return s.substr(b, e - b);
}

Value Split(const std::string& s, const Value& sep, int64_t maxsplit) {
  ValueList parts;
  if (sep.is_undefined() || sep.is_none()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && IsPySpace(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = s.size();
        while (e > i && IsPySpace(s[e - 1])) --e;
        parts.emplace_back(s.substr(i, e - i));
        break;
      }
      size_t j = i;
      while (j < s.size() && !IsPySpace(s[j])) ++j;
      parts.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return Value::List(std::move(parts));
  }
  if (!sep.is_string()) Fail(absl::StrCat("split expects a str separator, got ", sep.TypeName()));
  const std::string& d = sep.as_string();
  if (d.empty()) Fail("split: empty separator");
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    size_t found = s.find(d, start);
    if (found == std::string::npos) break;
    parts.emplace_back(s.substr(start, found - start));
    start = found + d.size();
  }
  parts.emplace_back(s.substr(start));
  return Value::List(std::move(parts));
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, const BuiltinLimits& limits) {
  std::string out;
  if (from.empty()) Fail("replace: empty search string is not supported");
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t found = s.find(from, start);
    if (found == std::string::npos) break;
    out.append(s, start, found - start);
    out += to;
    if (out.size() > limits.max_value_bytes) Fail("replace: result too large");
    start = found + from.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string AsciiCase(std::string s, bool upper) {
  for (char& c : s) {
    if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return s;
}

std::string Capitalize(const std::string& s) {
  std::string out = AsciiCase(s, false);
  if (!out.empty()) out = AsciiCase(out.substr(0, 1), true) + out.substr(1);
  return out;
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (alpha) c = start ? AsciiCase(std::string(1, c), true)[0] : AsciiCase(std::string(1, c), false)[0];
    start = !alpha && !(static_cast<unsigned char>(c) >= 0x80);
  }
  return out;
}

// json.dumps(ensure_ascii=True) escapes every non-ASCII code point.
std::string EscapeNonAscii(const std::string& s) {
  std::string out;
  std::vector<size_t> offsets = CodePointOffsets(s);
  for (size_t k = 0; k < offsets.size(); ++k) {
    size_t b = offsets[k], e = k + 1 < offsets.size() ? offsets[k + 1] : s.size();
    unsigned char c = static_cast<unsigned char>(s[b]);
    if (c < 0x80) {
      out += s[b];
      continue;
    }
    uint32_t cp = e - b == 2 ? (c & 0x1F) : e - b == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = b + 1; i < e; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
    auto emit = [&](uint32_t u) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out += buf;
    };
    if (cp >= 0x10000) {
      cp -= 0x10000;
      emit(0xD800 + (cp >> 10));
      emit(0xDC00 + (cp & 0x3FF));
    } else {
      emit(cp);
    }
  }
  return out;
}

}  // namespace tandem::chat::internal
