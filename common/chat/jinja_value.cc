#include "common/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "utf8proc.h"

namespace tandem::chat::jinja {

void ThrowType(const std::string& message) { throw JinjaError(JinjaError::Kind::kType, message); }

namespace {

// Values nested deeper than this (a hostile request's JSON, or a list a template wraps in a list
// in a loop) are refused rather than walked recursively to a stack overflow.
constexpr int kMaxNesting = 512;
thread_local int nesting = 0;

class NestingGuard {
 public:
  NestingGuard() {
    if (++nesting > kMaxNesting) {
      --nesting;
      throw JinjaError(JinjaError::Kind::kType,
                       "values nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
  }
  ~NestingGuard() { --nesting; }
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;
};

}  // namespace

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (k.Equals(key)) return &v;
  }
  return nullptr;
}

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.string_value() == key) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (k.Equals(key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::MakeList(List items, bool tuple) {
  Value v(Kind::kList);
  v.tuple_ = tuple;
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::MakeGenerator(List items) {
  Value v = MakeList(std::move(items));
  v.generator_ = true;
  return v;
}

Value Value::MakeDict(Dict dict) {
  Value v(Kind::kDict);
  v.dict_ = std::make_shared<Dict>(std::move(dict));
  return v;
}

Value Value::MakeNamespace(Dict attributes) {
  Value v(Kind::kNamespace);
  v.dict_ = std::make_shared<Dict>(std::move(attributes));
  return v;
}

Value Value::MakeCallable(std::string name, NativeFunction function) {
  Value v(Kind::kCallable);
  v.callable_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(function)});
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  NestingGuard guard;
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return None();
    case nlohmann::ordered_json::value_t::boolean: return Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Float(static_cast<double>(u));
      return Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJson(item));
      return MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      dict.items.reserve(json.size());
      for (const auto& [key, item] : json.items())
        dict.items.emplace_back(String(key), FromJson(item));
      return MakeDict(std::move(dict));
    }
    default: return None();
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0;
    case Kind::kString: return !string_.empty();
    case Kind::kList: return generator_ || !list_->empty();
    case Kind::kDict: return !dict_->items.empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

std::string FormatFloat(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  char buffer[64];
  // Shortest round-trip digits, then laid out as Python's repr does: positional for exponents in
  // [-4, 16), scientific with a sign and at least two exponent digits otherwise.
  auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string sci(buffer, result.ptr);
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  return out + exp_text;
}

namespace {

bool IsPrintable(char32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

std::string ReprString(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : DecodeUtf8(s)) {
    char escape[16];
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x7f && cp >= 0x20) {
      out += static_cast<char>(cp);
    } else if (IsPrintable(cp) && cp >= 0x7f) {
      AppendUtf8(cp, &out);
    } else {
      if (cp < 0x100) {
        std::snprintf(escape, sizeof(escape), "\\x%02x", static_cast<unsigned>(cp));
      } else if (cp < 0x10000) {
        std::snprintf(escape, sizeof(escape), "\\u%04x", static_cast<unsigned>(cp));
      } else {
        std::snprintf(escape, sizeof(escape), "\\U%08x", static_cast<unsigned>(cp));
      }
      out += escape;
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kString: return string_;
    default: return Repr();
  }
}

std::string Value::Repr() const {
  NestingGuard guard;
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "None";
    case Kind::kBool: return int_ ? "True" : "False";
    case Kind::kInt: return std::to_string(int_);
    case Kind::kFloat: return FormatFloat(float_);
    case Kind::kString:
      return markup_ ? "Markup(" + ReprString(string_) + ")" : ReprString(string_);
    case Kind::kList: {
      if (generator_) return "<generator object>";
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].Repr();
      }
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = kind_ == Kind::kNamespace ? "<Namespace {" : "{";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        if (i) out += ", ";
        out += dict_->items[i].first.Repr() + ": " + dict_->items[i].second.Repr();
      }
      return out + (kind_ == Kind::kNamespace ? "}>" : "}");
    }
    case Kind::kCallable: return "<" + callable_->name + ">";
  }
  return "";
}

bool Value::Equals(const Value& other) const {
  NestingGuard guard;
  if (is_number() && other.is_number()) {
    if (kind_ == Kind::kFloat || other.kind_ == Kind::kFloat) return AsDouble() == other.AsDouble();
    return int_ == other.int_;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return string_ == other.string_;
    case Kind::kList:
      if (generator_ || other.generator_) return list_ == other.list_;
      if (tuple_ != other.tuple_ || list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*other.list_)[i])) return false;
      }
      return true;
    case Kind::kDict:
      if (dict_->items.size() != other.dict_->items.size()) return false;
      for (const auto& [k, v] : dict_->items) {
        const Value* found = other.dict_->Find(k);
        if (found == nullptr || !found->Equals(v)) return false;
      }
      return true;
    case Kind::kNamespace: return dict_ == other.dict_;
    case Kind::kCallable: return callable_ == other.callable_;
    default: return false;
  }
}

bool Value::Less(const Value& other) const {
  NestingGuard guard;
  if (is_number() && other.is_number()) {
    if (kind_ == Kind::kFloat || other.kind_ == Kind::kFloat) return AsDouble() < other.AsDouble();
    return int_ < other.int_;
  }
  if (is_string() && other.is_string())
    return string_ < other.string_;  // UTF-8 keeps code point order
  if (is_sequence() && other.is_sequence() && tuple_ == other.tuple_) {
    const size_t n = std::min(list_->size(), other.list_->size());
    for (size_t i = 0; i < n; ++i) {
      if (!(*list_)[i].Equals((*other.list_)[i])) return (*list_)[i].Less((*other.list_)[i]);
    }
    return list_->size() < other.list_->size();
  }
  if (is_undefined() || other.is_undefined()) (is_undefined() ? *this : other).ThrowUndefined();
  ThrowType("'<' not supported between instances of '" + TypeName() + "' and '" + other.TypeName() +
            "'");
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return generator_ ? "generator" : tuple_ ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

std::string Value::ObjectDescription() const {
  if (kind_ == Kind::kNone) return "None";
  return TypeName() + " object";
}

void Value::ThrowUndefined() const {
  throw JinjaError(JinjaError::Kind::kUndefined, string_.empty() ? "undefined value" : string_);
}

Value CallArgs::Get(size_t index, std::string_view name, Value fallback) const {
  const Value* by_keyword = nullptr;
  for (const auto& [key, value] : keyword) {
    if (key == name) by_keyword = &value;
  }
  if (index < positional.size()) {
    if (by_keyword != nullptr)
      ThrowType("got multiple values for argument '" + std::string(name) + "'");
    return positional[index];
  }
  return by_keyword != nullptr ? *by_keyword : fallback;
}

void CallArgs::CheckKnown(std::string_view function,
                          std::initializer_list<std::string_view> names) const {
  if (positional.size() > names.size()) {
    ThrowType(std::string(function) + "() takes at most " + std::to_string(names.size()) +
              " arguments (" + std::to_string(positional.size()) + " given)");
  }
  for (const auto& [key, value] : keyword) {
    if (std::find(names.begin(), names.end(), key) == names.end()) {
      ThrowType(std::string(function) + "() got an unexpected keyword argument '" + key + "'");
    }
  }
}

namespace {

void JsonString(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char escape[8];
          std::snprintf(escape, sizeof(escape), "\\u%04x", c);
          out += escape;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

std::string JsonKey(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString: return key.string_value();
    case Value::Kind::kBool: return key.bool_value() ? "true" : "false";
    case Value::Kind::kNone: return "null";
    case Value::Kind::kInt: return std::to_string(key.int_value());
    case Value::Kind::kFloat: return FormatFloat(key.float_value());
    default: ThrowType("keys must be str, int, float, bool or None, not " + key.TypeName());
  }
}

void AppendJson(const Value& value, const JsonOptions& options, int depth, std::string& out) {
  NestingGuard guard;
  auto newline = [&](int level) {
    if (!options.has_indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += options.indent;
  };
  switch (value.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += value.bool_value() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(value.int_value()); return;
    case Value::Kind::kFloat: {
      const double f = value.float_value();
      if (std::isnan(f)) {
        out += "NaN";
      } else if (std::isinf(f)) {
        out += f < 0 ? "-Infinity" : "Infinity";
      } else {
        out += FormatFloat(f);
      }
      return;
    }
    case Value::Kind::kString: JsonString(value.string_value(), out); return;
    case Value::Kind::kList: {
      if (value.is_generator()) ThrowType("Object of type generator is not JSON serializable");
      if (value.list().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < value.list().size(); ++i) {
        if (i) out += options.item_separator;
        newline(depth + 1);
        AppendJson(value.list()[i], options, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (value.dict().items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, v] : value.dict().items) entries.emplace_back(JsonKey(k), &v);
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += options.item_separator;
        newline(depth + 1);
        JsonString(entries[i].first, out);
        out += options.key_separator;
        AppendJson(*entries[i].second, options, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: ThrowType("Object of type " + value.TypeName() + " is not JSON serializable");
  }
}

}  // namespace

std::string ToJson(const Value& value, const JsonOptions& options) {
  std::string out;
  AppendJson(value, options, 0, out);
  return out;
}

std::string HtmlEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&#34;"; break;
      default: out += c;
    }
  }
  return out;
}

std::u32string DecodeUtf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n =
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                         static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    if (n <= 0) {
      out.push_back(0xFFFD);
      ++i;
    } else {
      out.push_back(static_cast<char32_t>(cp));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

std::string EncodeUtf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : text) AppendUtf8(cp, &out);
  return out;
}

bool IsPythonSpace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

std::string StripPython(std::string_view text, bool left, bool right, const std::u32string* chars) {
  const std::u32string cps = DecodeUtf8(text);
  auto strip = [&](char32_t c) {
    return chars == nullptr ? IsPythonSpace(c) : chars->find(c) != std::u32string::npos;
  };
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  if (begin == 0 && end == cps.size()) return std::string(text);
  return EncodeUtf8(std::u32string_view(cps).substr(begin, end - begin));
}

size_t CodePointLength(std::string_view text) {
  size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace tandem::chat::jinja
