#include "common/chat/jinja.h"

#include <utility>

#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_lexer.h"
#include "common/chat/jinja_parser.h"

namespace tandem::chat {
namespace jinja {
namespace {

// Bounds on one rendering (hostile templates): macro call depth, statements and loop iterations
// executed, and bytes of output.
constexpr int kMaxCallDepth = 64;
constexpr int64_t kMaxSteps = 20'000'000;
constexpr size_t kMaxOutputBytes = 64u << 20;

// A scope: for loops, macros, with blocks and generation blocks open one; if blocks do not.
struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> variables;

  const Value* Find(std::string_view name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent.get()) {
      for (const auto& [key, value] : f->variables) {
        if (key == name) return &value;
      }
    }
    return nullptr;
  }
  void Set(const std::string& name, Value value) {
    for (auto& [key, v] : variables) {
      if (key == name) {
        v = std::move(value);
        return;
      }
    }
    variables.emplace_back(name, std::move(value));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  Interpreter(const nlohmann::ordered_json& variables) {
    globals_ = std::make_shared<Frame>();
    for (auto& [key, value] : MakeGlobals().items)
      globals_->variables.emplace_back(key.string_value(), value);
    for (const auto& [key, value] : variables.items()) globals_->Set(key, Value::FromJson(value));
  }

  std::string Run(const Body& body) {
    auto top = std::make_shared<Frame>();
    top->parent = globals_;
    std::string out;
    Exec(body, top, out);
    return out;
  }

 private:
  void Step() {
    if (++steps_ > kMaxSteps) {
      throw JinjaError(JinjaError::Kind::kSecurity, "the template ran past its limit of " +
                                                        std::to_string(kMaxSteps) + " steps");
    }
  }

  void Append(std::string& out, const std::string& text) {
    if (out.size() + text.size() > kMaxOutputBytes) {
      throw JinjaError(JinjaError::Kind::kSecurity,
                       "the template's output passed its limit of 64 MiB");
    }
    out += text;
  }

  Flow Exec(const Body& body, const std::shared_ptr<Frame>& frame, std::string& out) {
    for (const auto& node : body) {
      Step();
      Flow flow;
      try {
        flow = ExecNode(*node, frame, out);
      } catch (const JinjaError& e) {
        const std::string message = e.what();
        if (e.kind() == JinjaError::Kind::kRaised || message.rfind("line ", 0) == 0) throw;
        throw JinjaError(e.kind(), "line " + std::to_string(node->line) + ": " + message);
      }
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  std::string Capture(const Body& body, const std::shared_ptr<Frame>& frame) {
    std::string out;
    Exec(body, frame, out);
    return out;
  }

  static std::shared_ptr<Frame> Child(const std::shared_ptr<Frame>& parent) {
    auto frame = std::make_shared<Frame>();
    frame->parent = parent;
    return frame;
  }

  void Assign(const Target& target, Value value, const std::shared_ptr<Frame>& frame) {
    if (target.attribute.empty()) {
      frame->Set(target.name, std::move(value));
      return;
    }
    const Value* object = frame->Find(target.name);
    if (object == nullptr || !object->is_namespace()) {
      throw JinjaError(JinjaError::Kind::kType, "cannot assign attribute on non-namespace object");
    }
    object->mutable_namespace().Set(Value::String(target.attribute), std::move(value));
  }

  void AssignTargets(const Node& node, const Value& value, const std::shared_ptr<Frame>& frame) {
    if (!node.unpack) {
      Assign(node.targets[0], value, frame);
      return;
    }
    List items = Iterate(value);
    if (items.size() != node.targets.size()) {
      ThrowType(
          items.size() > node.targets.size()
              ? "too many values to unpack (expected " + std::to_string(node.targets.size()) + ")"
              : "not enough values to unpack (expected " + std::to_string(node.targets.size()) +
                    ", got " + std::to_string(items.size()) + ")");
    }
    for (size_t i = 0; i < items.size(); ++i) Assign(node.targets[i], items[i], frame);
  }

  Flow ExecNode(const Node& node, const std::shared_ptr<Frame>& frame, std::string& out) {
    switch (node.kind) {
      case Node::Kind::kText: Append(out, node.text); return Flow::kNormal;
      case Node::Kind::kOutput: Append(out, Eval(*node.expr, frame).Str()); return Flow::kNormal;
      case Node::Kind::kIf:
        for (size_t i = 0; i < node.conditions.size(); ++i) {
          if (Eval(*node.conditions[i], frame).Truthy()) return Exec(node.bodies[i], frame, out);
        }
        return Exec(node.else_body, frame, out);
      case Node::Kind::kFor: return ExecFor(node, frame, out);
      case Node::Kind::kSet:
        AssignTargets(node, Eval(*node.expr, frame), frame);
        return Flow::kNormal;
      case Node::Kind::kSetBlock: {
        Value value = Value::String(Capture(node.body, frame));
        if (node.filter) value = ApplyFilterChain(*node.filter, value, frame);
        Assign(node.targets[0], std::move(value), frame);
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: frame->Set(node.name, MakeMacro(node, frame)); return Flow::kNormal;
      case Node::Kind::kFilterBlock: {
        const Value body = Value::String(Capture(node.body, Child(frame)));
        Append(out, ApplyFilterChain(*node.filter, body, frame).Str());
        return Flow::kNormal;
      }
      case Node::Kind::kWith: {
        auto scope = Child(frame);
        for (size_t i = 0; i < node.targets.size(); ++i)
          scope->Set(node.targets[i].name, Eval(*node.values[i], frame));
        return Exec(node.body, scope, out);
      }
      case Node::Kind::kScope: Exec(node.body, Child(frame), out); return Flow::kNormal;
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Flow ExecFor(const Node& node, const std::shared_ptr<Frame>& frame, std::string& out) {
    List items = Iterate(Eval(*node.expr, frame));
    if (node.condition) {
      List kept;
      for (const Value& item : items) {
        Step();
        auto scope = Child(frame);
        AssignTargets(node, item, scope);
        if (Eval(*node.condition, scope).Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return Exec(node.else_body, Child(frame), out);
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      Step();
      // Each iteration starts from the enclosing scope: what the body sets does not survive it.
      auto scope = Child(frame);
      AssignTargets(node, items[static_cast<size_t>(i)], scope);
      Dict loop;
      auto set = [&](const char* key, Value v) {
        loop.items.emplace_back(Value::String(key), std::move(v));
      };
      set("index", Value::Int(i + 1));
      set("index0", Value::Int(i));
      set("revindex", Value::Int(length - i));
      set("revindex0", Value::Int(length - i - 1));
      set("first", Value::Bool(i == 0));
      set("last", Value::Bool(i == length - 1));
      set("length", Value::Int(length));
      set("depth", Value::Int(1));
      set("depth0", Value::Int(0));
      if (i > 0) set("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < length) set("nextitem", items[static_cast<size_t>(i + 1)]);
      set("cycle", Value::MakeCallable("loop.cycle", [i](CallArgs& args) {
            if (args.positional.empty()) ThrowType("no items for cycling given");
            return args.positional[static_cast<size_t>(i) % args.positional.size()];
          }));
      scope->Set("loop", Value::MakeDict(std::move(loop)));
      if (Exec(node.body, scope, out) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value MakeMacro(const Node& node, const std::shared_ptr<Frame>& defining) {
    std::weak_ptr<Frame> weak = defining;  // the frame holds the macro: no reference cycle
    return Value::MakeCallable("Macro '" + node.name + "'", [this, &node, weak](CallArgs& args) {
      std::shared_ptr<Frame> parent = weak.lock();
      if (!parent) ThrowType("macro '" + node.name + "' called after its scope ended");
      if (++depth_ > kMaxCallDepth) {
        throw JinjaError(JinjaError::Kind::kSecurity,
                         "macro calls nested deeper than " + std::to_string(kMaxCallDepth));
      }
      auto scope = Child(parent);
      List varargs;
      for (size_t i = 0; i < args.positional.size(); ++i) {
        if (i < node.params.size()) {
          scope->Set(node.params[i], args.positional[i]);
        } else {
          varargs.push_back(args.positional[i]);
        }
      }
      Dict kwargs;
      for (const auto& [key, value] : args.keyword) {
        bool is_param = false;
        for (size_t i = 0; i < node.params.size(); ++i) {
          if (node.params[i] != key) continue;
          if (i < args.positional.size())
            ThrowType("macro '" + node.name + "' got multiple values for argument '" + key + "'");
          is_param = true;
        }
        if (is_param) {
          scope->Set(key, value);
        } else {
          kwargs.items.emplace_back(Value::String(key), value);
        }
      }
      for (size_t i = 0; i < node.params.size(); ++i) {
        bool bound = i < args.positional.size();
        for (const auto& [key, value] : args.keyword) bound |= key == node.params[i];
        if (bound) continue;
        scope->Set(node.params[i],
                   node.defaults[i]
                       ? Eval(*node.defaults[i], scope)
                       : Value::Undefined("parameter '" + node.params[i] + "' was not provided"));
      }
      scope->Set("varargs", Value::MakeList(std::move(varargs), /*tuple=*/true));
      scope->Set("kwargs", Value::MakeDict(std::move(kwargs)));
      std::string out;
      Exec(node.body, scope, out);
      --depth_;
      return Value::String(std::move(out));
    });
  }

  CallArgs EvalArgs(const Expr& e, size_t first, const std::shared_ptr<Frame>& frame) {
    CallArgs args;
    for (size_t i = first; i < e.children.size(); ++i)
      args.positional.push_back(Eval(*e.children[i], frame));
    if (e.star_args) {
      for (const Value& v : Iterate(Eval(*e.star_args, frame))) args.positional.push_back(v);
    }
    for (const auto& [key, value] : e.keywords) args.keyword.emplace_back(key, Eval(*value, frame));
    if (e.star_kwargs) {
      const Value kw = Eval(*e.star_kwargs, frame);
      if (!kw.is_dict()) ThrowType("argument after ** must be a mapping");
      for (const auto& [key, value] : kw.dict().items) args.keyword.emplace_back(key.Str(), value);
    }
    return args;
  }

  // A filter chain whose innermost filter has no operand (filter blocks, block sets): `body` is it.
  Value ApplyFilterChain(const Expr& filter, const Value& body,
                         const std::shared_ptr<Frame>& frame) {
    const Value input =
        filter.children[0] ? ApplyFilterChain(*filter.children[0], body, frame) : body;
    CallArgs args = EvalArgs(filter, 1, frame);
    return ApplyFilter(filter.name, input, args);
  }

  bool CompareOp(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return a.Equals(b);
    if (op == "!=") return !a.Equals(b);
    if (op == "<") return a.Less(b);
    if (op == ">") return b.Less(a);
    if (op == "<=") return !b.Less(a);
    if (op == ">=") return !a.Less(b);
    if (op == "in") return Contains(b, a);
    return !Contains(b, a);  // notin
  }

  Value Eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: {
        const Value* found = frame->Find(e.name);
        return found != nullptr ? *found : Value::Undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const auto& child : e.children) items.push_back(Eval(*child, frame));
        return Value::MakeList(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          dict.Set(Eval(*e.children[i], frame), Eval(*e.children[i + 1], frame));
        }
        return Value::MakeDict(std::move(dict));
      }
      case Expr::Kind::kGetAttr: return GetAttribute(Eval(*e.children[0], frame), e.name);
      case Expr::Kind::kGetItem: {
        const Value object = Eval(*e.children[0], frame);
        const Expr& index = *e.children[1];
        if (index.kind == Expr::Kind::kSlice) {
          auto part = [&](size_t i) {
            return index.children[i] ? Eval(*index.children[i], frame) : Value::None();
          };
          return GetSlice(object, part(0), part(1), part(2));
        }
        return GetItem(object, Eval(index, frame));
      }
      case Expr::Kind::kSlice: ThrowType("a slice outside a subscript");
      case Expr::Kind::kCall: {
        const Value callee = Eval(*e.children[0], frame);
        CallArgs args = EvalArgs(e, 1, frame);
        if (callee.is_undefined()) callee.ThrowUndefined();
        if (!callee.is_callable()) ThrowType("'" + callee.TypeName() + "' object is not callable");
        return callee.callable().function(args);
      }
      case Expr::Kind::kFilter: {
        const Value value = Eval(*e.children[0], frame);
        CallArgs args = EvalArgs(e, 1, frame);
        return ApplyFilter(e.name, value, args);
      }
      case Expr::Kind::kTest: {
        const Value value = Eval(*e.children[0], frame);
        CallArgs args = EvalArgs(e, 1, frame);
        return Value::Bool(ApplyTest(e.name, value, args) != e.negated);
      }
      case Expr::Kind::kUnary: {
        const Value operand = Eval(*e.children[0], frame);
        if (e.name == "not") return Value::Bool(!operand.Truthy());
        if (e.name == "-") return Negate(operand);
        if (!operand.is_number()) {
          if (operand.is_undefined()) operand.ThrowUndefined();
          ThrowType("bad operand type for unary +: '" + operand.TypeName() + "'");
        }
        return operand.is_bool() ? Value::Int(operand.int_value()) : operand;
      }
      case Expr::Kind::kBinary:
        return BinaryOp(e.name, Eval(*e.children[0], frame), Eval(*e.children[1], frame));
      case Expr::Kind::kCompare: {
        Value left = Eval(*e.children[0], frame);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = Eval(*e.children[i + 1], frame);
          if (!CompareOp(e.ops[i], left, right)) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kAnd: {
        Value left = Eval(*e.children[0], frame);
        return left.Truthy() ? Eval(*e.children[1], frame) : left;
      }
      case Expr::Kind::kOr: {
        Value left = Eval(*e.children[0], frame);
        return left.Truthy() ? left : Eval(*e.children[1], frame);
      }
      case Expr::Kind::kCondition:
        if (Eval(*e.children[1], frame).Truthy()) return Eval(*e.children[0], frame);
        return e.children[2] ? Eval(*e.children[2], frame)
                             : Value::Undefined(
                                   "the inline if expression evaluated to false and no else "
                                   "section was defined");
    }
    ThrowType("unknown expression");
  }

  std::shared_ptr<Frame> globals_;
  int64_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace
}  // namespace jinja

JinjaTemplate::~JinjaTemplate() = default;

absl::StatusOr<std::unique_ptr<JinjaTemplate>> JinjaTemplate::Create(std::string_view source) {
  std::unique_ptr<JinjaTemplate> t(new JinjaTemplate());
  try {
    t->body_ = std::make_unique<jinja::Body>(jinja::Parse(jinja::Lex(source)));
  } catch (const jinja::JinjaError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return t;
}

absl::StatusOr<std::string> JinjaTemplate::Render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object())
    return absl::InvalidArgumentError("template variables must be a JSON object");
  try {
    jinja::Interpreter interpreter(variables);
    return interpreter.Run(*body_);
  } catch (const jinja::JinjaError& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

}  // namespace tandem::chat
