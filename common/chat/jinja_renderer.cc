#include "common/chat/jinja_renderer.h"

#include <ctime>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_builtins.h"

namespace tandem::chat {
namespace {

using internal::BuiltinError;
using internal::CallArgs;

// Thrown inside the renderer only; RenderTemplate turns it into a Status.
struct RenderError {
  SourcePos pos;
  std::string what;
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const Value& globals, const RenderLimits& limits) : limits_(limits) {
    builtin_limits_.max_value_bytes = limits.max_output_bytes;
    scopes_.emplace_back();
    // transformers' environment globals; the render context overrides them.
    for (const char* name : {"raise_exception", "strftime_now", "namespace", "range", "dict"}) {
      auto builtin = std::make_shared<Macro>();
      builtin->name = name;
      scopes_[0][name] = Value::FromMacro(std::move(builtin));
    }
    for (const auto& [k, v] : globals.as_dict()) scopes_[0][k] = v;
  }

  std::string Run(const NodeList& nodes) {
    std::string out;
    Flow flow = RenderNodes(nodes, &out);
    if (flow != Flow::kNormal) throw RenderError{{}, "'break' or 'continue' outside a loop"};
    return out;
  }

 private:
  [[noreturn]] static void Fail(SourcePos pos, std::string what) { throw RenderError{pos, std::move(what)}; }

  void Step(SourcePos pos) {
    if (++steps_ > limits_.max_steps) {
      Fail(pos, absl::StrCat("render exceeded ", limits_.max_steps, " evaluation steps"));
    }
  }

  void Append(std::string* out, std::string_view s, SourcePos pos) {
    if (out->size() + s.size() > limits_.max_output_bytes) {
      Fail(pos, absl::StrCat("output exceeds ", limits_.max_output_bytes, " bytes"));
    }
    out->append(s);
  }

  const Value* Lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > floor_;) {
      auto it = scopes_[i].find(name);
      if (it != scopes_[i].end()) return &it->second;
    }
    auto it = scopes_[0].find(name);
    return it == scopes_[0].end() ? nullptr : &it->second;
  }

  Flow RenderNodes(const NodeList& nodes, std::string* out) {
    for (const auto& node : nodes) {
      Flow flow = RenderNode(*node, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow RenderNode(const Node& node, std::string* out) {
    Step(node.pos);
    EvalDepthGuard guard(this, node.pos);
    switch (node.type) {
      case Node::Type::kText:
        Append(out, node.text, node.pos);
        return Flow::kNormal;
      case Node::Type::kOutput:
        Append(out, Eval(*node.expr).Str(), node.pos);
        return Flow::kNormal;
      case Node::Type::kIf:
        for (const auto& [cond, body] : node.branches) {
          if (Eval(*cond).Truthy()) return RenderNodes(body, out);
        }
        return RenderNodes(node.else_body, out);
      case Node::Type::kFor:
        return RenderFor(node, out);
      case Node::Type::kSet: {
        Value value = Eval(*node.expr);
        if (!node.attr.empty()) {
          const Value* target = Lookup(node.targets[0]);
          if (target == nullptr || !target->is_namespace()) {
            Fail(node.pos, absl::StrCat("cannot assign attribute on non-namespace object '", node.targets[0], "'"));
          }
          Value ns = *target;
          ns.Set(node.attr, std::move(value));
        } else {
          Assign(node.targets, value, node.pos);
        }
        return Flow::kNormal;
      }
      case Node::Type::kSetBlock: {
        std::string captured;
        RenderNodes(node.body, &captured);
        scopes_.back()[node.targets[0]] = Value(std::move(captured));
        return Flow::kNormal;
      }
      case Node::Type::kMacro: {
        auto macro = std::make_shared<Macro>();
        macro->name = node.text;
        macro->node = &node;
        scopes_.back()[node.text] = Value::FromMacro(std::move(macro));
        return Flow::kNormal;
      }
      case Node::Type::kBreak:
        return Flow::kBreak;
      case Node::Type::kContinue:
        return Flow::kContinue;
      case Node::Type::kBlock:
        return RenderNodes(node.body, out);
    }
    return Flow::kNormal;
  }

  void Assign(const std::vector<std::string>& targets, const Value& value, SourcePos pos) {
    auto& scope = scopes_.back();
    if (targets.size() == 1) {
      scope[targets[0]] = value;
      return;
    }
    std::vector<Value> items = Iterate(value, pos);
    if (items.size() != targets.size()) {
      Fail(pos, absl::StrCat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope[targets[i]] = items[i];
  }

  std::vector<Value> Iterate(const Value& v, SourcePos pos) {
    try {
      return internal::Iterate(v);
    } catch (const BuiltinError& e) {
      Fail(pos, e.what);
    }
  }

  Flow RenderFor(const Node& node, std::string* out) {
    std::vector<Value> items = Iterate(Eval(*node.expr), node.pos);
    if (node.cond) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        Step(node.pos);
        scopes_.emplace_back();
        Assign(node.targets, item, node.pos);
        bool keep = Eval(*node.cond).Truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return RenderNodes(node.else_body, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Step(node.pos);  // Empty bodies still cost: nested loops stay bounded.
      scopes_.emplace_back();
      Assign(node.targets, items[i], node.pos);
      ValueDict loop = {
          {"index0", Value(i)},
          {"index", Value(i + 1)},
          {"revindex0", Value(n - i - 1)},
          {"revindex", Value(n - i)},
          {"first", Value(i == 0)},
          {"last", Value(i == n - 1)},
          {"length", Value(n)},
          {"previtem", i > 0 ? items[i - 1] : Value::Undefined("there is no previous item")},
          {"nextitem", i + 1 < n ? items[i + 1] : Value::Undefined("there is no next item")},
          {"depth", Value(int64_t{1})},
          {"depth0", Value(int64_t{0})},
      };
      scopes_.back()["loop"] = Value::Dict(std::move(loop));
      Flow flow = RenderNodes(node.body, out);
      scopes_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  CallArgs EvalArgs(const Expr& e, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) args.args.push_back(Eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) args.kwargs.emplace_back(k, Eval(*v));
    return args;
  }

  static void RequireDefined(const Value& v, SourcePos pos) {
    if (v.is_undefined()) Fail(pos, v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
  }

  // Counts nested Eval/RenderNode frames; see RenderLimits::max_eval_depth.
  struct EvalDepthGuard {
    EvalDepthGuard(Renderer* r, SourcePos pos) : r(r) {
      if (++r->eval_depth_ > r->limits_.max_eval_depth) {
        Fail(pos, absl::StrCat("evaluation nested deeper than ", r->limits_.max_eval_depth,
                               " levels (recursive macros?)"));
      }
    }
    ~EvalDepthGuard() { --r->eval_depth_; }
    Renderer* r;
  };

  Value Eval(const Expr& e) {
    Step(e.pos);
    EvalDepthGuard guard(this, e.pos);
    Value v;
    try {
      v = EvalInner(e);
    } catch (const BuiltinError& err) {
      Fail(e.pos, err.what);
    }
    if (v.depth() > limits_.max_value_depth) {
      Fail(e.pos, absl::StrCat("value nested deeper than ", limits_.max_value_depth, " levels"));
    }
    return v;
  }

  Value EvalInner(const Expr& e) {
    switch (e.type) {
      case Expr::Type::kLiteral:
        return e.literal;
      case Expr::Type::kName: {
        if (const Value* v = Lookup(e.name)) return *v;
        return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
      }
      case Expr::Type::kList: {
        ValueList items;
        for (const auto& arg : e.args) items.push_back(Eval(*arg));
        return Value::List(std::move(items));
      }
      case Expr::Type::kDict: {
        Value dict = Value::Dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value key = Eval(*e.args[i]);
          if (!key.is_string()) Fail(e.args[i]->pos, "dict keys must be strings");
          dict.Set(key.as_string(), Eval(*e.args[i + 1]));
        }
        return dict;
      }
      case Expr::Type::kGetAttr: {
        Value obj = Eval(*e.args[0]);
        RequireDefined(obj, e.pos);
        return internal::GetItem(obj, Value(e.name));
      }
      case Expr::Type::kGetItem: {
        Value obj = Eval(*e.args[0]);
        RequireDefined(obj, e.pos);
        return internal::GetItem(obj, Eval(*e.args[1]));
      }
      case Expr::Type::kSlice: {
        Value obj = Eval(*e.args[0]);
        auto part = [&](int i) { return e.args[i] ? Eval(*e.args[i]) : Value(); };
        return internal::Slice(obj, part(1), part(2), part(3));
      }
      case Expr::Type::kCall:
        return EvalCall(e);
      case Expr::Type::kFilter: {
        Value target = Eval(*e.args[0]);
        return internal::ApplyFilter(e.name, target, EvalArgs(e, 1), builtin_limits_);
      }
      case Expr::Type::kTest: {
        Value target = Eval(*e.args[0]);
        bool result = internal::ApplyTest(e.name, target, EvalArgs(e, 1));
        return Value(e.negated ? !result : result);
      }
      case Expr::Type::kNot:
        return Value(!Eval(*e.args[0]).Truthy());
      case Expr::Type::kNeg:
      case Expr::Type::kPos: {
        Value v = Eval(*e.args[0]);
        RequireDefined(v, e.pos);
        if (!v.is_number()) Fail(e.pos, absl::StrCat("bad operand type for unary ", e.type == Expr::Type::kNeg ? "-" : "+", ": '", v.TypeName(), "'"));
        if (e.type == Expr::Type::kPos) return v.is_bool() ? Value(v.as_int()) : v;
        return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
      }
      case Expr::Type::kBinary:
      case Expr::Type::kCompare:
        return internal::BinaryOp(e.name, Eval(*e.args[0]), Eval(*e.args[1]), builtin_limits_);
      case Expr::Type::kAnd: {
        Value lhs = Eval(*e.args[0]);
        return lhs.Truthy() ? Eval(*e.args[1]) : lhs;
      }
      case Expr::Type::kOr: {
        Value lhs = Eval(*e.args[0]);
        return lhs.Truthy() ? lhs : Eval(*e.args[1]);
      }
      case Expr::Type::kCondExpr:
        if (Eval(*e.args[0]).Truthy()) return Eval(*e.args[1]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value::Undefined("the inline if-expression evaluated to false and no else section was defined");
    }
    return Value();
  }

  Value EvalCall(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.type == Expr::Type::kGetAttr) {
      Value obj = Eval(*callee.args[0]);
      if (obj.is_mapping()) {
        const Value* member = obj.Find(callee.name);
        if (member != nullptr && member->is_macro()) return CallMacro(*member, EvalArgs(e, 1), e.pos);
      }
      return internal::CallMethod(obj, callee.name, EvalArgs(e, 1), builtin_limits_);
    }
    Value fn = Eval(callee);
    if (fn.is_macro() && fn.as_macro().node == nullptr) {
      return CallGlobal(fn.as_macro().name, EvalArgs(e, 1), e.pos);
    }
    if (!fn.is_macro()) {
      RequireDefined(fn, e.pos);
      Fail(e.pos, absl::StrCat("'", fn.TypeName(), "' object is not callable"));
    }
    return CallMacro(fn, EvalArgs(e, 1), e.pos);
  }

  Value CallGlobal(const std::string& name, const CallArgs& args, SourcePos pos) {
    if (name == "raise_exception") {
      Fail(pos, absl::StrCat("raise_exception: ", args.Get(0, "message").Str()));
    }
    if (name == "namespace" || name == "dict") {
      ValueDict items;
      if (!args.args.empty()) {
        if (!args.args[0].is_dict() || args.args.size() > 1) Fail(pos, absl::StrCat(name, "() takes a dict or keyword arguments"));
        items = args.args[0].as_dict();
      }
      for (const auto& [k, v] : args.kwargs) {
        bool replaced = false;
        for (auto& item : items) {
          if (item.first == k) {
            item.second = v;
            replaced = true;
          }
        }
        if (!replaced) items.emplace_back(k, v);
      }
      return name == "namespace" ? Value::Namespace(std::move(items)) : Value::Dict(std::move(items));
    }
    if (name == "range") {
      std::vector<int64_t> nums;
      for (const Value& a : args.args) {
        if (!a.is_int() && !a.is_bool()) Fail(pos, "range() arguments must be integers");
        nums.push_back(a.as_int());
      }
      if (nums.empty() || nums.size() > 3) Fail(pos, "range() takes 1 to 3 arguments");
      int64_t start = nums.size() == 1 ? 0 : nums[0];
      int64_t stop = nums.size() == 1 ? nums[0] : nums[1];
      int64_t step = nums.size() == 3 ? nums[2] : 1;
      if (step == 0) Fail(pos, "range() step must not be zero");
      ValueList out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= 1'000'000) Fail(pos, "range() is limited to 1000000 items");
        out.emplace_back(i);
      }
      return Value::List(std::move(out));
    }
    if (name == "strftime_now") {
      std::string format = args.Get(0, "format").Str();
      std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[512];
      size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &tm);
      return Value(std::string(buf, n));
    }
    Fail(pos, absl::StrCat("'", name, "' is undefined (not a variable or a supported global function)"));
  }

  Value CallMacro(const Value& fn, const CallArgs& args, SourcePos pos) {
    const Node& node = *fn.as_macro().node;
    if (call_depth_ >= limits_.max_call_depth) {
      Fail(pos, absl::StrCat("macro calls nested deeper than ", limits_.max_call_depth));
    }
    if (args.args.size() > node.params.size()) {
      Fail(pos, absl::StrCat("macro '", node.text, "' takes ", node.params.size(), " arguments, got ", args.args.size()));
    }
    std::unordered_map<std::string, Value> frame;
    frame[node.text] = fn;
    for (size_t i = 0; i < node.params.size(); ++i) {
      const auto& [param, def] = node.params[i];
      Value v = i < args.args.size() ? args.args[i] : Value::Undefined(absl::StrCat("'", param, "' is undefined"));
      for (const auto& [k, kv] : args.kwargs) {
        if (k == param) v = kv;
      }
      if (v.is_undefined() && def) v = Eval(*def);
      frame[param] = v;
    }
    size_t saved_floor = floor_;
    floor_ = scopes_.size();
    scopes_.push_back(std::move(frame));
    ++call_depth_;
    std::string out;
    RenderNodes(node.body, &out);
    --call_depth_;
    scopes_.pop_back();
    floor_ = saved_floor;
    return Value(std::move(out));
  }

  RenderLimits limits_;
  internal::BuiltinLimits builtin_limits_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  size_t floor_ = 1;  // Scopes below this (except 0) are invisible here.
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> RenderTemplate(const NodeList& nodes, const Value& globals,
                                           std::string_view template_name,
                                           const RenderLimits& limits) {
  if (!globals.is_dict()) return absl::InvalidArgumentError("render context must be a JSON object");
  if (globals.depth() > limits.max_value_depth) {
    return absl::InvalidArgumentError(absl::StrCat("render context is nested deeper than ",
                                                   limits.max_value_depth, " levels"));
  }
  try {
    Renderer renderer(globals, limits);
    return renderer.Run(nodes);
  } catch (const RenderError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(template_name), ":", e.pos.line, ":", e.pos.column, ": ", e.what));
  }
}

}  // namespace tandem::chat
