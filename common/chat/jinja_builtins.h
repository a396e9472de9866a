#pragma once

// jinja2's filters, tests, globals-free string/dict methods, and Python
// operators over Value, as chat templates use them. Internal to
// tandem_chat: failures throw BuiltinError, which the renderer turns into a
// Status naming the template position.

#include <string>
#include <utility>
#include <vector>

#include "common/chat/value.h"

namespace tandem::chat::internal {

struct BuiltinError {
  std::string what;
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;

  // Positional `index` or keyword `name`, else `fallback`.
  Value Get(size_t index, std::string_view name, Value fallback = Value()) const;
};

// Limits that builtins which build large values must respect.
struct BuiltinLimits {
  size_t max_value_bytes = 16u << 20;
};

Value ApplyFilter(const std::string& name, const Value& target, const CallArgs& args,
                  const BuiltinLimits& limits);
bool ApplyTest(const std::string& name, const Value& target, const CallArgs& args);
// `target.method(args)` for str, dict and list methods.
Value CallMethod(const Value& target, const std::string& method, const CallArgs& args,
                 const BuiltinLimits& limits);
// Binary operators + - * / // % ** ~ and comparisons == != < <= > >= in notin.
Value BinaryOp(const std::string& op, const Value& lhs, const Value& rhs,
               const BuiltinLimits& limits);
// obj[key] the way jinja2's getitem works (undefined when absent).
Value GetItem(const Value& obj, const Value& key);
Value Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Python str methods (jinja_strings.cc). Case changes are ASCII-only.
bool IsPySpace(char c);
std::string Strip(const std::string& s, const Value& chars, bool left, bool right);
Value Split(const std::string& s, const Value& sep, int64_t maxsplit);
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, const BuiltinLimits& limits);
std::string AsciiCase(std::string s, bool upper);
std::string Capitalize(const std::string& s);
std::string Title(const std::string& s);
// json.dumps(ensure_ascii=True)'s \uXXXX escaping of non-ASCII code points.
std::string EscapeNonAscii(const std::string& s);

// Iterates like Python: list items, dict keys, string characters.
std::vector<Value> Iterate(const Value& v);

}  // namespace tandem::chat::internal
