#include "common/chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"

namespace tandem::chat::internal {
namespace {

[[noreturn]] void Fail(std::string what) { throw BuiltinError{std::move(what)}; }

void RequireDefined(const Value& v) {
  if (v.is_undefined()) {
    Fail(v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
  }
}

const std::string& RequireString(const Value& v, std::string_view what) {
  RequireDefined(v);
  if (!v.is_string()) Fail(absl::StrCat(std::string(what), " expects a str, got ", v.TypeName()));
  return v.as_string();
}

int64_t Length(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return static_cast<int64_t>(CodePointOffsets(v.as_string()).size());
  if (v.is_list()) return static_cast<int64_t>(v.as_list().size());
  if (v.is_mapping()) return static_cast<int64_t>(v.as_dict().size());
  Fail(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
}

Value GetAttribute(const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = numeric ? GetItem(cur, Value(static_cast<int64_t>(std::stoll(part)))) : GetItem(cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

int Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.as_string().compare(b.as_string()) < 0 ? -1 : a.as_string() == b.as_string() ? 0 : 1;
  if (a.is_list() && b.is_list()) {
    const ValueList& x = a.as_list();
    const ValueList& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!x[i].Equals(y[i])) return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  RequireDefined(a);
  RequireDefined(b);
  Fail(absl::StrCat("'<' not supported between instances of '", a.TypeName(), "' and '", b.TypeName(), "'"));
}

Value SelectOrReject(const Value& target, const CallArgs& args, bool by_attr, bool select) {
  ValueList out;
  size_t first = by_attr ? 1 : 0;
  std::string attr = by_attr ? RequireString(args.Get(0, "attribute"), "selectattr") : "";
  Value test_name = args.args.size() > first ? args.args[first] : Value();
  CallArgs test_args;
  for (size_t i = first + 1; i < args.args.size(); ++i) test_args.args.push_back(args.args[i]);
  for (const Value& item : Iterate(target)) {
    Value probe = by_attr ? GetAttribute(item, attr) : item;
    bool ok = test_name.is_undefined() ? probe.Truthy()
                                       : ApplyTest(RequireString(test_name, "select test"), probe, test_args);
    if (ok == select) out.push_back(item);
  }
  return Value::List(std::move(out));
}

}  // namespace

Value CallArgs::Get(size_t index, std::string_view name, Value fallback) const {
  for (const auto& [k, v] : kwargs) {
    if (k == name) return v;
  }
  if (index < args.size()) return args[index];
  return fallback;
}

std::vector<Value> Iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.as_list();
  if (v.is_dict()) {
    std::vector<Value> keys;
    for (const auto& [k, item] : v.as_dict()) keys.emplace_back(k);
    return keys;
  }
  if (v.is_string()) {
    const std::string& s = v.as_string();
    std::vector<size_t> offsets = CodePointOffsets(s);
    std::vector<Value> chars;
    for (size_t k = 0; k < offsets.size(); ++k) {
      size_t e = k + 1 < offsets.size() ? offsets[k + 1] : s.size();
      chars.emplace_back(s.substr(offsets[k], e - offsets[k]));
    }
    return chars;
  }
  Fail(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_mapping()) {
    if (key.is_string()) {
      if (const Value* found = obj.Find(key.as_string())) return *found;
      return Value::Undefined(absl::StrCat("'", obj.TypeName(), " object' has no attribute '", key.as_string(), "'"));
    }
    return Value::Undefined(absl::StrCat("'", obj.TypeName(), " object' has no element ", key.Repr()));
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list()[static_cast<size_t>(i)];
    } else {
      std::vector<Value> chars = Iterate(obj);
      int64_t n = static_cast<int64_t>(chars.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return chars[static_cast<size_t>(i)];
    }
    return Value::Undefined(absl::StrCat("'", obj.TypeName(), " object' has no element ", key.Repr()));
  }
  std::string what = key.is_string() ? absl::StrCat("attribute '", key.as_string(), "'") : absl::StrCat("element ", key.Repr());
  return Value::Undefined(absl::StrCat("'", obj.TypeName(), " object' has no ", what));
}

Value Slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto as_opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) Fail(absl::StrCat("slice ", what, " must be an integer"));
    return v.as_int();
  };
  int64_t step = as_opt(step_v, "step").value_or(1);
  if (step == 0) Fail("slice step cannot be zero");
  std::vector<Value> items = obj.is_string() ? Iterate(obj) : obj.is_list() ? obj.as_list() : std::vector<Value>();
  if (!obj.is_string() && !obj.is_list()) {
    RequireDefined(obj);
    Fail(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }
  int64_t n = static_cast<int64_t>(items.size());
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t start = clamp(as_opt(start_v, "start"), step > 0 ? 0 : n - 1);
  int64_t stop = clamp(as_opt(stop_v, "stop"), step > 0 ? n : -1);
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(items[static_cast<size_t>(i)]);
  if (obj.is_string()) {
    std::string s;
    for (const Value& c : out) s += c.as_string();
    return Value(std::move(s));
  }
  return Value::List(std::move(out));
}

bool ApplyTest(const std::string& name, const Value& v, const CallArgs& args) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_macro();
  if (name == "lower") return v.is_string() && AsciiCase(v.as_string(), false) == v.as_string();
  if (name == "upper") return v.is_string() && AsciiCase(v.as_string(), true) == v.as_string();
  Value other = args.Get(0, "other");
  if (name == "sameas") return v.Equals(other) && v.kind() == other.kind();
  if (name == "eq" || name == "equalto" || name == "==") return v.Equals(other);
  if (name == "ne" || name == "!=") return !v.Equals(other);
  if (name == "lt" || name == "lessthan" || name == "<") return Compare(v, other) < 0;
  if (name == "le" || name == "<=") return Compare(v, other) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return Compare(v, other) > 0;
  if (name == "ge" || name == ">=") return Compare(v, other) >= 0;
  if (name == "in") return BinaryOp("in", v, args.Get(0, "seq"), BuiltinLimits{}).as_bool();
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!v.is_int() && !v.is_bool()) Fail(absl::StrCat("test '", name, "' expects an integer"));
    int64_t d = name == "divisibleby" ? args.Get(0, "num").as_int() : 2;
    if (d == 0) Fail("divisibleby: division by zero");
    bool divisible = v.as_int() % d == 0;
    return name == "odd" ? !divisible : divisible;
  }
  Fail(absl::StrCat("no test named '", name, "'"));
}

Value ApplyFilter(const std::string& name, const Value& v, const CallArgs& args,
                  const BuiltinLimits& limits) {
  if (name == "default" || name == "d") {
    bool boolean = args.Get(1, "boolean", Value(false)).Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy())) return args.Get(0, "default_value", Value(""));
    return v;
  }
  if (name == "safe") return v;
  if (name == "string") return Value(v.Str());
  if (name == "length" || name == "count") return Value(Length(v));
  if (name == "tojson") {
    Value indent = args.Get(1, "indent");
    if (!args.Get(2, "separators").is_undefined() && !args.Get(2, "separators").is_none()) {
      Fail("tojson: separators are not supported");
    }
    auto json = v.ToJson(indent.is_int() ? static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64)) : -1,
                         args.Get(3, "sort_keys", Value(false)).Truthy());
    if (!json.ok()) Fail(std::string(json.status().message()));
    if (args.Get(0, "ensure_ascii", Value(false)).Truthy()) return Value(EscapeNonAscii(*json));
    return Value(*std::move(json));
  }
  if (name == "trim") return Value(Strip(v.Str(), args.Get(0, "chars"), true, true));
  if (name == "upper") return Value(AsciiCase(v.Str(), true));
  if (name == "lower") return Value(AsciiCase(v.Str(), false));
  if (name == "capitalize") return Value(Capitalize(v.Str()));
  if (name == "title") return Value(Title(v.Str()));
  if (name == "replace") {
    return Value(Replace(v.Str(), RequireString(args.Get(0, "old"), "replace"),
                         RequireString(args.Get(1, "new"), "replace"),
                         args.Get(2, "count", Value(int64_t{-1})).as_int(), limits));
  }
  if (name == "items" || name == "dictsort") {
    if (v.is_undefined()) return Value::List();
    if (!v.is_mapping()) Fail(absl::StrCat(name, ": expected a mapping, got ", v.TypeName()));
    ValueList pairs;
    for (const auto& [k, item] : v.as_dict()) pairs.push_back(Value::List({Value(k), item}));
    if (name == "dictsort") {
      bool case_sensitive = args.Get(0, "case_sensitive", Value(false)).Truthy();
      bool by_value = args.Get(1, "by", Value("key")).Str() == "value";
      bool reverse = args.Get(2, "reverse", Value(false)).Truthy();
      std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& a, const Value& b) {
        Value x = a.as_list()[by_value ? 1 : 0], y = b.as_list()[by_value ? 1 : 0];
        if (!case_sensitive && x.is_string() && y.is_string()) {
          x = Value(AsciiCase(x.as_string(), false));
          y = Value(AsciiCase(y.as_string(), false));
        }
        int c = Compare(x, y);
        return reverse ? c > 0 : c < 0;
      });
    }
    return Value::List(std::move(pairs));
  }
  if (name == "list") return Value::List(Iterate(v));
  if (name == "first" || name == "last") {
    std::vector<Value> items = Iterate(v);
    if (items.empty()) return Value::Undefined(absl::StrCat("No ", name, " item, sequence was empty."));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) return Slice(v, Value(), Value(), Value(int64_t{-1}));
    std::vector<Value> items = Iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "join") {
    std::string sep = args.Get(0, "d", Value("")).Str();
    Value attr = args.Get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : Iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += attr.is_undefined() ? item.Str() : GetAttribute(item, attr.Str()).Str();
      if (out.size() > limits.max_value_bytes) Fail("join: result too large");
    }
    return Value(std::move(out));
  }
  if (name == "map") {
    ValueList out;
    Value attr = args.Get(99, "attribute");
    if (!attr.is_undefined()) {
      Value fallback = args.Get(99, "default");
      for (const Value& item : Iterate(v)) {
        Value got = GetAttribute(item, attr.Str());
        out.push_back(got.is_undefined() && !fallback.is_undefined() ? fallback : got);
      }
      return Value::List(std::move(out));
    }
    if (args.args.empty()) Fail("map: expected a filter name or attribute=");
    std::string filter = RequireString(args.args[0], "map");
    CallArgs rest;
    rest.args.assign(args.args.begin() + 1, args.args.end());
    rest.kwargs = args.kwargs;
    for (const Value& item : Iterate(v)) out.push_back(ApplyFilter(filter, item, rest, limits));
    return Value::List(std::move(out));
  }
  if (name == "selectattr") return SelectOrReject(v, args, true, true);
  if (name == "rejectattr") return SelectOrReject(v, args, true, false);
  if (name == "select") return SelectOrReject(v, args, false, true);
  if (name == "reject") return SelectOrReject(v, args, false, false);
  if (name == "unique") {
    ValueList out;
    for (const Value& item : Iterate(v)) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return o.Equals(item); })) out.push_back(item);
    }
    return Value::List(std::move(out));
  }
  if (name == "sort") {
    std::vector<Value> items = Iterate(v);
    bool reverse = args.Get(0, "reverse", Value(false)).Truthy();
    Value attr = args.Get(2, "attribute");
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      int c = attr.is_undefined() ? Compare(a, b) : Compare(GetAttribute(a, attr.Str()), GetAttribute(b, attr.Str()));
      return reverse ? c > 0 : c < 0;
    });
    return Value::List(std::move(items));
  }
  if (name == "int") {
    if (v.is_number()) return Value(static_cast<int64_t>(v.as_double()));
    if (v.is_string()) {
      try {
        size_t used = 0;
        int64_t i = std::stoll(v.as_string(), &used);
        if (used == v.as_string().size()) return Value(i);
      } catch (...) {
      }
    }
    return args.Get(0, "default", Value(int64_t{0}));
  }
  if (name == "float") {
    if (v.is_number()) return Value(v.as_double());
    if (v.is_string()) {
      try {
        return Value(std::stod(v.as_string()));
      } catch (...) {
      }
    }
    return args.Get(0, "default", Value(0.0));
  }
  if (name == "abs") {
    if (v.is_float()) return Value(std::fabs(v.as_double()));
    if (v.is_number()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    Fail("abs: expected a number");
  }
  if (name == "round") {
    int64_t precision = args.Get(0, "precision", Value(int64_t{0})).as_int();
    double scale = std::pow(10.0, static_cast<double>(precision));
    return Value(std::round(v.as_double() * scale) / scale);
  }
  if (name == "sum" || name == "min" || name == "max") {
    std::vector<Value> items = Iterate(v);
    if (name == "sum") {
      Value total = args.Get(1, "start", Value(int64_t{0}));
      for (const Value& item : items) total = BinaryOp("+", total, item, limits);
      return total;
    }
    if (items.empty()) return Value::Undefined(absl::StrCat("No aggregated item, sequence was empty."));
    Value best = items[0];
    for (const Value& item : items) {
      int c = Compare(item, best);
      if (name == "min" ? c < 0 : c > 0) best = item;
    }
    return best;
  }
  if (name == "indent") {
    int64_t width = args.Get(0, "width", Value(int64_t{4})).as_int();
    bool first = args.Get(1, "first", Value(false)).Truthy();
    bool blank = args.Get(2, "blank", Value(false)).Truthy();
    std::string pad(static_cast<size_t>(std::clamp<int64_t>(width, 0, 256)), ' ');
    std::string s = v.Str(), out;
    size_t start = 0;
    bool first_line = true;
    while (true) {
      size_t nl = s.find('\n', start);
      std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      bool indent_line = first_line ? first : (blank || !line.empty());
      if (indent_line && !line.empty()) out += pad;
      else if (indent_line && first_line) out += pad;
      out += line;
      if (nl == std::string::npos) break;
      out += '\n';
      start = nl + 1;
      first_line = false;
    }
    return Value(std::move(out));
  }
  if (name == "escape" || name == "e") {
    std::string out;
    for (char c : v.Str()) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
      }
    }
    return Value(std::move(out));
  }
  Fail(absl::StrCat("no filter named '", name, "'"));
}

Value CallMethod(const Value& target, const std::string& method, const CallArgs& args,
                 const BuiltinLimits& limits) {
  if (target.is_string()) {
    const std::string& s = target.as_string();
    if (method == "strip") return Value(Strip(s, args.Get(0, "chars"), true, true));
    if (method == "lstrip") return Value(Strip(s, args.Get(0, "chars"), true, false));
    if (method == "rstrip") return Value(Strip(s, args.Get(0, "chars"), false, true));
    if (method == "split") return Split(s, args.Get(0, "sep"), args.Get(1, "maxsplit", Value(int64_t{-1})).as_int());
    if (method == "upper") return Value(AsciiCase(s, true));
    if (method == "lower") return Value(AsciiCase(s, false));
    if (method == "capitalize") return Value(Capitalize(s));
    if (method == "title") return Value(Title(s));
    if (method == "startswith" || method == "endswith") {
      Value arg = args.Get(0, "prefix");
      std::vector<Value> options = arg.is_list() ? arg.as_list() : std::vector<Value>{arg};
      for (const Value& o : options) {
        const std::string& p = RequireString(o, method);
        bool hit = method == "startswith" ? s.compare(0, p.size(), p) == 0
                                          : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
        if (hit) return Value(true);
      }
      return Value(false);
    }
    if (method == "replace") {
      return Value(Replace(s, RequireString(args.Get(0, "old"), "replace"), RequireString(args.Get(1, "new"), "replace"),
                           args.Get(2, "count", Value(int64_t{-1})).as_int(), limits));
    }
    if (method == "find" || method == "count") {
      const std::string& sub = RequireString(args.Get(0, "sub"), method);
      if (method == "find") {
        size_t found = s.find(sub);
        if (found == std::string::npos) return Value(int64_t{-1});
        return Value(static_cast<int64_t>(CodePointOffsets(s.substr(0, found)).size()));
      }
      if (sub.empty()) return Value(Length(target) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value(n);
    }
    if (method == "join") {
      std::string out;
      bool first = true;
      for (const Value& item : Iterate(args.Get(0, "iterable"))) {
        if (!first) out += s;
        first = false;
        out += RequireString(item, "join");
        if (out.size() > limits.max_value_bytes) Fail("join: result too large");
      }
      return Value(std::move(out));
    }
  } else if (target.is_mapping()) {
    if (method == "get") {
      const Value* found = target.Find(RequireString(args.Get(0, "key"), "get"));
      return found ? *found : args.Get(1, "default", Value::None());
    }
    if (method == "items") return ApplyFilter("items", target, {}, limits);
    if (method == "keys") return Value::List(Iterate(target));
    if (method == "values") {
      ValueList values;
      for (const auto& [k, item] : target.as_dict()) values.push_back(item);
      return Value::List(std::move(values));
    }
  }
  RequireDefined(target);
  Fail(absl::StrCat("'", target.TypeName(), "' object has no method '", method, "'"));
}

Value BinaryOp(const std::string& op, const Value& a, const Value& b, const BuiltinLimits& limits) {
  if (op == "==") return Value(a.Equals(b));
  if (op == "!=") return Value(!a.Equals(b));
  if (op == "~") {
    std::string out = a.Str() + b.Str();
    if (out.size() > limits.max_value_bytes) Fail("string too large");
    return Value(std::move(out));
  }
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      found = b.as_string().find(RequireString(a, "'in <string>'")) != std::string::npos;
    } else if (b.is_list()) {
      found = std::any_of(b.as_list().begin(), b.as_list().end(), [&](const Value& x) { return x.Equals(a); });
    } else if (b.is_mapping()) {
      found = a.is_string() && b.Find(a.as_string()) != nullptr;
    } else if (!b.is_undefined()) {
      Fail(absl::StrCat("argument of type '", b.TypeName(), "' is not iterable"));
    }
    return Value(op == "in" ? found : !found);
  }
  if (op == "<") return Value(Compare(a, b) < 0);
  if (op == "<=") return Value(Compare(a, b) <= 0);
  if (op == ">") return Value(Compare(a, b) > 0);
  if (op == ">=") return Value(Compare(a, b) >= 0);
  RequireDefined(a);
  RequireDefined(b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.as_string().size() + b.as_string().size() > limits.max_value_bytes) Fail("string too large");
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      ValueList out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value::List(std::move(out));
    }
  }
  if (op == "*" && ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool()))) {
    int64_t n = std::max<int64_t>(0, b.as_int());
    size_t unit = a.is_string() ? a.as_string().size() : a.as_list().size() * 16;
    if (unit > 0 && static_cast<uint64_t>(n) > limits.max_value_bytes / unit) Fail("repetition result too large");
    if (a.is_string()) {
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += a.as_string();
      return Value(std::move(out));
    }
    ValueList out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), a.as_list().begin(), a.as_list().end());
    return Value::List(std::move(out));
  }
  if (a.is_number() && b.is_number()) {
    bool ints = !a.is_float() && !b.is_float();
    int64_t x = a.as_int(), y = b.as_int();
    double dx = a.as_double(), dy = b.as_double();
    if (op == "+") return ints ? Value(static_cast<int64_t>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y))) : Value(dx + dy);
    if (op == "-") return ints ? Value(static_cast<int64_t>(static_cast<uint64_t>(x) - static_cast<uint64_t>(y))) : Value(dx - dy);
    if (op == "*") return ints ? Value(static_cast<int64_t>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y))) : Value(dx * dy);
    if (op == "/") {
      if (dy == 0) Fail("division by zero");
      return Value(dx / dy);
    }
    if (op == "//" || op == "%") {
      if (ints) {
        if (y == 0) Fail("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) Fail("integer overflow");
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return op == "//" ? Value(q) : Value(r);
      }
      if (dy == 0) Fail("float division by zero");
      double q = std::floor(dx / dy);
      return op == "//" ? Value(q) : Value(dx - q * dy);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < y && i < 64; ++i) r = static_cast<int64_t>(static_cast<uint64_t>(r) * static_cast<uint64_t>(x));
        return Value(r);
      }
      return Value(std::pow(dx, dy));
    }
  }
  Fail(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(), "' and '", b.TypeName(), "'"));
}

}  // namespace tandem::chat::internal
