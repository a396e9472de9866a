#pragma once

// The values a chat template computes with: Python's None, bool, int, float,
// str, list and dict as jinja2 sees them, plus jinja2's Undefined, a
// namespace() object and macros. Lists, dicts and namespaces are shared by
// reference, as Python objects are, so `set ns.x = 1` is seen through every
// name bound to the namespace.
//
// Strings are UTF-8. Length, indexing and slicing count code points, as
// Python does; upper/lower change ASCII letters only.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem::chat {

class Value;
struct Macro;
using ValueList = std::vector<Value>;
// Insertion-ordered like a Python dict; chat contexts hold small dicts, so a
// linear lookup is the fastest and simplest choice.
using ValueDict = std::vector<std::pair<std::string, Value>>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kMacro
  };

  Value() = default;  // Undefined.
  static Value None();
  static Value Undefined(std::string hint = "");
  Value(bool b);  // NOLINT: implicit like a Python literal.
  Value(int64_t i);  // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d);  // NOLINT
  Value(std::string s);  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}  // NOLINT
  static Value List(ValueList items = {});
  static Value Dict(ValueDict items = {});
  static Value Namespace(ValueDict items = {});
  static Value FromMacro(std::shared_ptr<const Macro> macro);
  // JSON nested deeper than 1000 levels is cut off and reported through
  // depth(), so the renderer's depth limit refuses it.
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_mapping() const { return is_dict() || is_namespace(); }
  bool is_macro() const { return kind_ == Kind::kMacro; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return is_bool() ? (b_ ? 1 : 0) : i_; }
  double as_double() const { return is_float() ? d_ : static_cast<double>(as_int()); }
  const std::string& as_string() const { return *s_; }
  const ValueList& as_list() const { return *list_; }
  ValueList& mutable_list() { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }
  ValueDict& mutable_dict() { return *dict_; }
  const Macro& as_macro() const { return *macro_; }
  // Nesting depth of lists and dicts (0 for scalars and namespaces), so
  // renderers can refuse values too deep to print or destroy recursively.
  int depth() const { return depth_; }
  // For Undefined: what was looked up, for error messages.
  const std::string& undefined_hint() const;

  // Dict/namespace lookup; nullptr when absent or not a mapping.
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value value);

  // Python truthiness (Undefined is false).
  bool Truthy() const;
  // Python's str(): what `{{ x }}` prints. Undefined prints as "".
  std::string Str() const;
  // Python's repr(), used inside list and dict str().
  std::string Repr() const;
  // json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=...) as
  // transformers' tojson filter calls it. indent < 0 means None.
  // Fails for values JSON cannot hold (Undefined, macros).
  absl::StatusOr<std::string> ToJson(int indent = -1,
                                     bool sort_keys = false) const;
  // Python ==.
  bool Equals(const Value& other) const;
  // A short type name as Python says it ("str", "dict", ...).
  std::string TypeName() const;

 private:
  static Value FromJsonAt(const nlohmann::ordered_json& json, int depth);

  Kind kind_ = Kind::kUndefined;
  int depth_ = 0;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Macro> macro_;
};

// Python's repr() of a float ("1.0", "0.1", "1e-05", "inf").
std::string FormatPythonFloat(double d);
// Python's repr() of a str (quotes chosen as Python does).
std::string PythonStringRepr(std::string_view s);
// Splits UTF-8 into code point start offsets (malformed bytes count as one).
std::vector<size_t> CodePointOffsets(std::string_view s);

}  // namespace tandem::chat
