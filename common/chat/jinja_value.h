// The values a Jinja template computes with, with Python's semantics where jinja2 inherits them:
// truthiness, ==, ordering, +, str() and repr(), and json.dumps for `tojson`. Strings are UTF-8;
// lengths, indexes and slices count code points, as Python's str does.
//
// Lists, dicts and namespaces are shared by reference, as Python objects are; only namespaces
// change after creation (`{% set ns.x = ... %}`): the sandbox transformers uses forbids mutating
// the rest.
#ifndef TANDEM_COMMON_CHAT_JINJA_VALUE_H_
#define TANDEM_COMMON_CHAT_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/utf8.h"
#include "nlohmann/json.hpp"

namespace tandem::chat::jinja {

// An error while parsing or rendering; caught at the JinjaTemplate boundary and returned as a
// Status, never thrown past it.
class JinjaError : public std::runtime_error {
 public:
  enum class Kind { kSyntax, kUnsupported, kUndefined, kType, kSecurity, kRaised };
  JinjaError(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

[[noreturn]] void ThrowType(const std::string& message);

class Value;
struct CallArgs;
using List = std::vector<Value>;
using NativeFunction = std::function<Value(CallArgs&)>;

// Insertion-ordered, as Python dicts are; keys compare with Python ==. Dicts here are small.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  void Set(Value key, Value value);
};

struct Callable {
  std::string name;  // for messages: "range", "macro 'render'", "method 'split' of str"
  NativeFunction function;
};

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
    kCallable
  };

  Value() = default;  // undefined
  static Value Undefined(std::string hint = "") {
    Value v;
    v.string_ = std::move(hint);
    return v;
  }
  static Value None() { return Value(Kind::kNone); }
  static Value Bool(bool b) {
    Value v(Kind::kBool);
    v.int_ = b;
    return v;
  }
  static Value Int(int64_t i) {
    Value v(Kind::kInt);
    v.int_ = i;
    return v;
  }
  static Value Float(double f) {
    Value v(Kind::kFloat);
    v.float_ = f;
    return v;
  }
  static Value String(std::string s) {
    Value v(Kind::kString);
    v.string_ = std::move(s);
    return v;
  }
  // markupsafe's Markup: a str that jinja2's `safe` and `escape` filters return; `+` and `%` with
  // it HTML-escape the plain-str operand.
  static Value Markup(std::string s) {
    Value v = String(std::move(s));
    v.markup_ = true;
    return v;
  }
  static Value MakeList(List items, bool tuple = false);
  // What filters such as map, select and reverse return in jinja2: an iterator, always true, with
  // no len() and no indexing; iterating it (or |list) gives the items.
  static Value MakeGenerator(List items);
  static Value MakeDict(Dict dict);
  static Value MakeNamespace(Dict attributes);
  static Value MakeCallable(std::string name, NativeFunction function);
  // JSON → Python objects as json.loads makes them (objects keep their key order).
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }  // not bool
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const {
    return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat;
  }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return kind_ == Kind::kString && markup_; }
  bool is_list() const { return kind_ == Kind::kList; }  // list or tuple
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_generator() const { return kind_ == Kind::kList && generator_; }
  bool is_sequence() const { return kind_ == Kind::kList && !generator_; }  // list or tuple
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool bool_value() const { return int_ != 0; }
  int64_t int_value() const { return int_; }  // bool and int
  double float_value() const { return float_; }
  double AsDouble() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& string_value() const { return string_; }
  const std::string& undefined_hint() const { return string_; }
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }  // dict or namespace attributes
  Dict& mutable_namespace() const { return *dict_; }
  const Callable& callable() const { return *callable_; }

  // Python's bool(), str(), repr(); str of undefined is "" (jinja2's default Undefined).
  bool Truthy() const;
  std::string Str() const;
  std::string Repr() const;
  // Python's ==; Less raises a TypeError for types Python cannot order.
  bool Equals(const Value& other) const;
  bool Less(const Value& other) const;
  // Python's type name, for messages ("str", "int", "dict", "NoneType").
  std::string TypeName() const;
  // How jinja2 names the object in an undefined-attribute message ("dict object", "None").
  std::string ObjectDescription() const;

  // Throws the UndefinedError this undefined value stands for.
  [[noreturn]] void ThrowUndefined() const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  bool generator_ = false;
  bool markup_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string string_;  // string, or an undefined value's message
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Callable> callable_;
};

// Positional and keyword arguments of a call, as jinja2 passes them.
struct CallArgs {
  List positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Binds Python-style: parameter `index` by position or `name` by keyword; `fallback` when
  // neither. Throws TypeError for an argument given twice or one the signature does not know
  // (CheckKnown).
  Value Get(size_t index, std::string_view name, Value fallback = Value()) const;
  void CheckKnown(std::string_view function, std::initializer_list<std::string_view> names) const;
};

// markupsafe's escape of a str: & < > ' " as entities.
std::string HtmlEscape(std::string_view text);

// Python's float repr (shortest round trip; 1e-05, 1e+16, 3.0).
std::string FormatFloat(double value);
// json.dumps(value, ensure_ascii=False, indent=..., separators=..., sort_keys=...).
struct JsonOptions {
  std::string indent;  // used when has_indent
  bool has_indent = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
std::string ToJson(const Value& value, const JsonOptions& options);

// Code-point helpers (Python str semantics over UTF-8).
std::u32string DecodeUtf8(std::string_view text);
std::string EncodeUtf8(std::u32string_view text);
bool IsPythonSpace(char32_t cp);
// Python's str.strip/lstrip/rstrip: code points in `chars` (null: Unicode whitespace) removed from
// the left and/or right end.
std::string StripPython(std::string_view text, bool left, bool right,
                        const std::u32string* chars = nullptr);
size_t CodePointLength(std::string_view text);

}  // namespace tandem::chat::jinja

#endif  // TANDEM_COMMON_CHAT_JINJA_VALUE_H_
