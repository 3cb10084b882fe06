// Python's operators, attribute and item access, slicing and iteration for Jinja values, and the
// methods of str, dict and list that templates call.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "common/chat/jinja_builtins.h"
#include "utf8proc.h"

namespace tandem::chat::jinja {
namespace {

[[noreturn]] void ThrowUnsupportedOperands(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.ThrowUndefined();
  if (b.is_undefined()) b.ThrowUndefined();
  ThrowType("unsupported operand type(s) for " + std::string(op) + ": '" + a.TypeName() +
            "' and '" + b.TypeName() + "'");
}

Value CheckedInt(bool overflow, const int64_t& value) {
  if (overflow) ThrowType("integer overflow (beyond 64 bits)");
  return Value::Int(value);
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

double FloatMod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

Value Repeat(const Value& seq, int64_t times) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.string_value();
    return seq.is_markup() ? Value::Markup(std::move(out)) : Value::String(std::move(out));
  }
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value::MakeList(std::move(out), seq.is_tuple());
}

// Python's printf-style `str % args` for the conversions templates use (%s %r %d %i %f %%).
Value PercentFormat(const std::string& format, const Value& args) {
  List values = args.is_tuple() ? args.list() : List{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) ThrowType("incomplete format");
    const char c = format[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= values.size()) ThrowType("not enough arguments for format string");
    const Value& v = values[next++];
    if (c == 's') {
      out += v.Str();
    } else if (c == 'r') {
      out += v.Repr();
    } else if ((c == 'd' || c == 'i') && v.is_number()) {
      out += std::to_string(v.is_float() ? static_cast<int64_t>(v.float_value()) : v.int_value());
    } else if (c == 'f' && v.is_number()) {
      char buffer[64];
      std::snprintf(buffer, sizeof(buffer), "%f", v.AsDouble());
      out += buffer;
    } else {
      throw JinjaError(JinjaError::Kind::kUnsupported,
                       std::string("format conversion '%") + c + "' is not supported");
    }
  }
  if (next < values.size()) ThrowType("not all arguments converted during string formatting");
  return Value::String(std::move(out));
}

}  // namespace

Value BinaryOp(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") return Value::String(a.Str() + b.Str());
  const bool numbers = a.is_number() && b.is_number();
  const bool any_float = a.is_float() || b.is_float();
  int64_t r = 0;
  if (op == "+") {
    if (numbers) {
      if (any_float) return Value::Float(a.AsDouble() + b.AsDouble());
      const bool overflow = __builtin_add_overflow(a.int_value(), b.int_value(), &r);
      return CheckedInt(overflow, r);
    }
    if (a.is_string() && b.is_string()) {
      if (a.is_markup() || b.is_markup()) {
        return Value::Markup((a.is_markup() ? a.string_value() : HtmlEscape(a.string_value())) +
                             (b.is_markup() ? b.string_value() : HtmlEscape(b.string_value())));
      }
      return Value::String(a.string_value() + b.string_value());
    }
    if (a.is_sequence() && b.is_sequence() && a.is_tuple() == b.is_tuple()) {
      List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value::MakeList(std::move(out), a.is_tuple());
    }
    if (a.is_string() && !b.is_undefined() && !a.is_undefined()) {
      ThrowType("can only concatenate str (not \"" + b.TypeName() + "\") to str");
    }
    ThrowUnsupportedOperands("+", a, b);
  }
  if (op == "-") {
    if (!numbers) ThrowUnsupportedOperands("-", a, b);
    if (any_float) return Value::Float(a.AsDouble() - b.AsDouble());
    const bool overflow = __builtin_sub_overflow(a.int_value(), b.int_value(), &r);
    return CheckedInt(overflow, r);
  }
  if (op == "*") {
    if (numbers) {
      if (any_float) return Value::Float(a.AsDouble() * b.AsDouble());
      const bool overflow = __builtin_mul_overflow(a.int_value(), b.int_value(), &r);
      return CheckedInt(overflow, r);
    }
    if ((a.is_string() || a.is_sequence()) && (b.is_int() || b.is_bool())) {
      return Repeat(a, std::max<int64_t>(0, b.int_value()));
    }
    if ((b.is_string() || b.is_sequence()) && (a.is_int() || a.is_bool())) {
      return Repeat(b, std::max<int64_t>(0, a.int_value()));
    }
    ThrowUnsupportedOperands("*", a, b);
  }
  if (op == "/") {
    if (!numbers) ThrowUnsupportedOperands("/", a, b);
    if (b.AsDouble() == 0) ThrowType("division by zero");
    return Value::Float(a.AsDouble() / b.AsDouble());
  }
  if (op == "//") {
    if (!numbers) ThrowUnsupportedOperands("//", a, b);
    if (b.AsDouble() == 0) ThrowType("integer division or modulo by zero");
    if (any_float) return Value::Float(std::floor(a.AsDouble() / b.AsDouble()));
    return Value::Int(FloorDiv(a.int_value(), b.int_value()));
  }
  if (op == "%") {
    if (a.is_string()) {
      if (!a.is_markup()) return PercentFormat(a.string_value(), b);
      // Markup % args escapes each argument (already-Markup ones are kept).
      List escaped;
      for (const Value& arg : b.is_tuple() ? b.list() : List{b}) {
        escaped.push_back(arg.is_markup() ? arg : Value::Markup(HtmlEscape(arg.Str())));
      }
      return Value::Markup(
          PercentFormat(a.string_value(), Value::MakeList(std::move(escaped), true))
              .string_value());
    }
    if (!numbers) ThrowUnsupportedOperands("%", a, b);
    if (b.AsDouble() == 0) ThrowType("integer division or modulo by zero");
    if (any_float) return Value::Float(FloatMod(a.AsDouble(), b.AsDouble()));
    return Value::Int(a.int_value() - FloorDiv(a.int_value(), b.int_value()) * b.int_value());
  }
  if (op == "**") {
    if (!numbers) ThrowUnsupportedOperands("** or pow()", a, b);
    if (any_float || b.int_value() < 0) return Value::Float(std::pow(a.AsDouble(), b.AsDouble()));
    int64_t result = 1;
    for (int64_t i = 0; i < b.int_value(); ++i) {
      if (__builtin_mul_overflow(result, a.int_value(), &result))
        ThrowType("integer overflow (beyond 64 bits)");
    }
    return Value::Int(result);
  }
  ThrowType("unknown operator " + std::string(op));
}

Value Negate(const Value& value) {
  if (value.is_float()) return Value::Float(-value.float_value());
  if (value.is_number()) return Value::Int(-value.int_value());
  if (value.is_undefined()) value.ThrowUndefined();
  ThrowType("bad operand type for unary -: '" + value.TypeName() + "'");
}

bool Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      if (item.is_undefined()) item.ThrowUndefined();
      ThrowType("'in <string>' requires string as left operand, not " + item.TypeName());
    }
    return container.string_value().find(item.string_value()) != std::string::npos;
  }
  if (container.is_dict()) return container.dict().Find(item) != nullptr;
  for (const Value& v : Iterate(container)) {
    if (v.Equals(item)) return true;
  }
  return false;
}

List Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return value.list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, v] : value.dict().items) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (char32_t cp : DecodeUtf8(value.string_value())) {
        std::string s;
        AppendUtf8(cp, &s);
        chars.push_back(Value::String(std::move(s)));
      }
      return chars;
    }
    default: ThrowType("'" + value.TypeName() + "' object is not iterable");
  }
}

int64_t Length(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(CodePointLength(value.string_value()));
    case Value::Kind::kList:
      if (value.is_generator()) ThrowType("object of type 'generator' has no len()");
      return static_cast<int64_t>(value.list().size());
    case Value::Kind::kDict: return static_cast<int64_t>(value.dict().items.size());
    default: ThrowType("object of type '" + value.TypeName() + "' has no len()");
  }
}

namespace {

// Python's slice.indices(): start, stop, step clamped for a sequence of `length`.
void SliceIndices(int64_t length, const Value& start_v, const Value& stop_v, const Value& step_v,
                  int64_t& start, int64_t& stop, int64_t& step) {
  auto as_index = [](const Value& v) {
    if (!v.is_int() && !v.is_bool())
      ThrowType("slice indices must be integers or None or have an __index__ method");
    return v.int_value();
  };
  step = step_v.is_none() || step_v.is_undefined() ? 1 : as_index(step_v);
  if (step == 0) ThrowType("slice step cannot be zero");
  const int64_t lower = step < 0 ? -1 : 0;
  const int64_t upper = step < 0 ? length - 1 : length;
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (v.is_none() || v.is_undefined()) return fallback;
    int64_t i = as_index(v);
    if (i < 0) {
      i += length;
      if (i < lower) i = lower;
    } else if (i > upper) {
      i = upper;
    }
    return i;
  };
  start = clamp(start_v, step < 0 ? upper : lower);
  stop = clamp(stop_v, step < 0 ? lower : upper);
}

}  // namespace

Value GetSlice(const Value& object, const Value& start_v, const Value& stop_v,
               const Value& step_v) {
  if (object.is_undefined()) object.ThrowUndefined();
  if (!object.is_string() && !object.is_sequence()) {
    ThrowType("'" + object.TypeName() + "' object is not subscriptable");
  }
  std::u32string cps;
  if (object.is_string()) cps = DecodeUtf8(object.string_value());
  const int64_t length = object.is_string() ? static_cast<int64_t>(cps.size())
                                            : static_cast<int64_t>(object.list().size());
  int64_t start, stop, step;
  SliceIndices(length, start_v, stop_v, step_v, start, stop, step);
  std::u32string out_cps;
  List out_items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (object.is_string()) {
      out_cps.push_back(cps[static_cast<size_t>(i)]);
    } else {
      out_items.push_back(object.list()[static_cast<size_t>(i)]);
    }
  }
  if (object.is_string()) return Value::String(EncodeUtf8(out_cps));
  return Value::MakeList(std::move(out_items), object.is_tuple());
}

Value GetItem(const Value& object, const Value& key) {
  if (object.is_undefined()) object.ThrowUndefined();
  if (object.is_dict()) {
    if (const Value* found = object.dict().Find(key)) return *found;
  } else if ((object.is_sequence() || object.is_string()) && (key.is_int() || key.is_bool())) {
    const int64_t length = Length(object);
    int64_t i = key.int_value();
    if (i < 0) i += length;
    if (i >= 0 && i < length) {
      if (object.is_list()) return object.list()[static_cast<size_t>(i)];
      std::string s;
      AppendUtf8(DecodeUtf8(object.string_value())[static_cast<size_t>(i)], &s);
      return Value::String(std::move(s));
    }
  }
  if (key.is_string()) return GetAttribute(object, key.string_value());
  return Value::Undefined(object.ObjectDescription() + " has no element " + key.Repr());
}

namespace {

using Method = Value (*)(const Value& self, CallArgs& args);

std::u32string StripSet(const Value& chars) {
  if (chars.is_none() || chars.is_undefined()) return U"";
  if (!chars.is_string()) ThrowType("strip arg must be None or str");
  return DecodeUtf8(chars.string_value());
}

Value Strip(const Value& self, const Value& chars_v, bool left, bool right) {
  const bool whitespace = chars_v.is_none() || chars_v.is_undefined();
  const std::u32string chars = StripSet(chars_v);
  return Value::String(
      StripPython(self.string_value(), left, right, whitespace ? nullptr : &chars));
}

std::string StringArg(const Value& v, const char* what) {
  if (!v.is_string()) ThrowType(std::string(what) + " must be str, not " + v.TypeName());
  return v.string_value();
}

Value Split(const Value& self, CallArgs& args, bool from_right) {
  const Value sep = args.Get(0, "sep", Value::None());
  const Value maxsplit_v = args.Get(1, "maxsplit", Value::Int(-1));
  int64_t maxsplit = maxsplit_v.int_value();
  const std::string& s = self.string_value();
  List parts;
  if (sep.is_none()) {
    const std::u32string cps = DecodeUtf8(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
      if (i == cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      // Python keeps the unsplit remainder as it is, save the whitespace at the split point.
      if (!from_right) {
        const size_t rest = words[static_cast<size_t>(maxsplit)].first;
        words.resize(static_cast<size_t>(maxsplit));
        words.emplace_back(rest, cps.size());
      } else {
        const size_t keep_from = words.size() - static_cast<size_t>(maxsplit);
        size_t head_end = keep_from < words.size() ? words[keep_from].first : cps.size();
        while (head_end > 0 && IsPythonSpace(cps[head_end - 1])) --head_end;
        std::vector<std::pair<size_t, size_t>> split{{0, head_end}};
        split.insert(split.end(), words.begin() + static_cast<long>(keep_from), words.end());
        words = std::move(split);
      }
    }
    for (const auto& [b, e] : words)
      parts.push_back(Value::String(EncodeUtf8(std::u32string_view(cps).substr(b, e - b))));
    return Value::MakeList(std::move(parts));
  }
  const std::string separator = StringArg(sep, "separator");
  if (separator.empty()) ThrowType("empty separator");
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t start = 0;
    while (maxsplit != 0) {
      const size_t found = s.find(separator, start);
      if (found == std::string::npos) break;
      pieces.push_back(s.substr(start, found - start));
      start = found + separator.size();
      --maxsplit;
    }
    pieces.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    while (maxsplit != 0 && end >= separator.size()) {
      const size_t found = s.rfind(separator, end - separator.size());
      if (found == std::string::npos) break;
      pieces.push_back(s.substr(found + separator.size(), end - found - separator.size()));
      end = found;
      --maxsplit;
    }
    pieces.push_back(s.substr(0, end));
    std::reverse(pieces.begin(), pieces.end());
  }
  for (auto& p : pieces) parts.push_back(Value::String(std::move(p)));
  return Value::MakeList(std::move(parts));
}

bool AffixMatch(const Value& self, const Value& affix, bool prefix) {
  const std::string& s = self.string_value();
  auto one = [&](const Value& a) {
    const std::string x = StringArg(a, prefix ? "startswith first arg" : "endswith first arg");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_tuple()) {
    for (const Value& a : affix.list()) {
      if (one(a)) return true;
    }
    return false;
  }
  return one(affix);
}

bool IsCased(char32_t cp) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL ||
         category == UTF8PROC_CATEGORY_LT;
}

}  // namespace

std::string PythonLower(const std::string& s) {
  std::string out;
  for (char32_t cp : DecodeUtf8(s))
    AppendUtf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), &out);
  return out;
}

std::string PythonUpper(const std::string& s) {
  std::string out;
  for (char32_t cp : DecodeUtf8(s)) {
    // The common full case mappings of SpecialCasing.txt that utf8proc's simple mapping lacks.
    switch (cp) {
      case 0xDF: out += "SS"; continue;
      case 0xFB00: out += "FF"; continue;
      case 0xFB01: out += "FI"; continue;
      case 0xFB02: out += "FL"; continue;
      case 0xFB03: out += "FFI"; continue;
      case 0xFB04: out += "FFL"; continue;
      case 0xFB05:
      case 0xFB06: out += "ST"; continue;
      default:
        AppendUtf8(static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))),
                   &out);
    }
  }
  return out;
}

std::string PythonTitle(const std::string& s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t cp : DecodeUtf8(s)) {
    const auto c = static_cast<utf8proc_int32_t>(cp);
    AppendUtf8(static_cast<char32_t>(previous_cased ? utf8proc_tolower(c) : utf8proc_totitle(c)),
               &out);
    previous_cased = IsCased(cp);
  }
  return out;
}

std::string PythonCapitalize(const std::string& s) {
  std::u32string cps = DecodeUtf8(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    const auto c = static_cast<utf8proc_int32_t>(cps[i]);
    AppendUtf8(static_cast<char32_t>(i == 0 ? utf8proc_totitle(c) : utf8proc_tolower(c)), &out);
  }
  return out;
}

std::vector<std::string> PythonSplitLines(const std::string& s, bool keep_ends) {
  const std::u32string cps = DecodeUtf8(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool boundary = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c ||
                          c == 0x1d || c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!boundary) continue;
    size_t end = i + 1;
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') end = i + 2;
    lines.push_back(
        EncodeUtf8(std::u32string_view(cps).substr(start, (keep_ends ? end : i) - start)));
    start = end;
    i = end - 1;
  }
  if (start < cps.size()) lines.push_back(EncodeUtf8(std::u32string_view(cps).substr(start)));
  return lines;
}

namespace {

// str.format with automatic and explicit field numbering and names; no format specs.
Value StrFormat(const std::string& format, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') ++i;
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) ThrowType("Single '{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    bool repr = false;
    if (field.size() >= 2 && field[field.size() - 2] == '!') {
      repr = field.back() == 'r';
      field.resize(field.size() - 2);
    }
    if (field.find_first_of(":.[") != std::string::npos) {
      throw JinjaError(JinjaError::Kind::kUnsupported,
                       "format fields with specs, attributes or indexes are not supported");
    }
    Value v;
    if (field.empty()) {
      if (auto_index >= args.positional.size())
        ThrowType("Replacement index out of range for positional args tuple");
      v = args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(),
                           [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t index = std::stoul(field);
      if (index >= args.positional.size())
        ThrowType("Replacement index out of range for positional args tuple");
      v = args.positional[index];
    } else {
      bool found = false;
      for (const auto& [key, value] : args.keyword) {
        if (key == field) {
          v = value;
          found = true;
        }
      }
      if (!found) ThrowType("KeyError: '" + field + "'");
    }
    out += repr ? v.Repr() : v.Str();
  }
  return Value::String(std::move(out));
}

Value StringMethod(const Value& self, const std::string& name, CallArgs& args) {
  const std::string& s = self.string_value();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return Strip(self, args.Get(0, "chars", Value::None()), name != "rstrip", name != "lstrip");
  }
  if (name == "split" || name == "rsplit") return Split(self, args, name == "rsplit");
  if (name == "startswith" || name == "endswith") {
    return Value::Bool(AffixMatch(self, args.Get(0, "prefix"), name == "startswith"));
  }
  if (name == "replace") {
    const std::string old = StringArg(args.Get(0, "old"), "replace() argument 1");
    const std::string replacement = StringArg(args.Get(1, "new"), "replace() argument 2");
    int64_t count = args.Get(2, "count", Value::Int(-1)).int_value();
    std::string out;
    if (old.empty()) {
      // Python inserts the replacement between every code point (and at both ends).
      const std::u32string cps = DecodeUtf8(s);
      for (size_t i = 0; i <= cps.size(); ++i) {
        if (count != 0) {
          out += replacement;
          --count;
        }
        if (i < cps.size()) AppendUtf8(cps[i], &out);
      }
      return Value::String(std::move(out));
    }
    size_t start = 0;
    while (count != 0) {
      const size_t found = s.find(old, start);
      if (found == std::string::npos) break;
      out += s.substr(start, found - start) + replacement;
      start = found + old.size();
      --count;
    }
    return Value::String(out + s.substr(start));
  }
  if (name == "lower") return Value::String(PythonLower(s));
  if (name == "upper") return Value::String(PythonUpper(s));
  if (name == "title") return Value::String(PythonTitle(s));
  if (name == "capitalize") return Value::String(PythonCapitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const std::string sub = StringArg(args.Get(0, "sub"), "must be str");
    if (name == "count") {
      if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointLength(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value::Int(n);
    }
    const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (name == "index" || name == "rindex") ThrowType("substring not found");
      return Value::Int(-1);
    }
    return Value::Int(static_cast<int64_t>(CodePointLength(std::string_view(s).substr(0, at))));
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& item : Iterate(args.Get(0, "iterable"))) {
      if (!item.is_string())
        ThrowType("sequence item: expected str instance, " + item.TypeName() + " found");
      if (!first) out += s;
      first = false;
      out += item.string_value();
    }
    return Value::String(std::move(out));
  }
  if (name == "splitlines") {
    List out;
    for (auto& line : PythonSplitLines(s, args.Get(0, "keepends", Value::Bool(false)).Truthy())) {
      out.push_back(Value::String(std::move(line)));
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "format") return StrFormat(s, args);
  const std::u32string cps = DecodeUtf8(s);
  auto all = [&](auto predicate) {
    if (cps.empty()) return Value::Bool(false);
    return Value::Bool(std::all_of(cps.begin(), cps.end(), predicate));
  };
  auto category = [](char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); };
  if (name == "isspace") return all([](char32_t c) { return IsPythonSpace(c); });
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") {
    return all([&](char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; });
  }
  if (name == "isalpha") {
    return all([&](char32_t c) {
      const auto k = category(c);
      return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
    });
  }
  if (name == "isalnum") {
    return all([&](char32_t c) {
      const auto k = category(c);
      return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || k == UTF8PROC_CATEGORY_ND;
    });
  }
  if (name == "islower" || name == "isupper") {
    const bool lower = name == "islower";
    bool any_cased = false;
    for (char32_t c : cps) {
      const auto k = category(c);
      if (k == UTF8PROC_CATEGORY_LT || k == (lower ? UTF8PROC_CATEGORY_LU : UTF8PROC_CATEGORY_LL))
        return Value::Bool(false);
      any_cased |= k == (lower ? UTF8PROC_CATEGORY_LL : UTF8PROC_CATEGORY_LU);
    }
    return Value::Bool(any_cased);
  }
  throw JinjaError(JinjaError::Kind::kUnsupported, "str." + name + "() is not supported");
}

constexpr std::string_view kStringMethods[] = {
    "strip",   "lstrip",    "rstrip",    "split",   "rsplit",     "startswith", "endswith",
    "replace", "lower",     "upper",     "title",   "capitalize", "find",       "rfind",
    "index",   "rindex",    "count",     "join",    "splitlines", "format",     "isspace",
    "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum",    "islower",    "isupper"};
constexpr std::string_view kDictMethods[] = {"items", "keys", "values", "get"};
constexpr std::string_view kDictMutators[] = {"pop",   "popitem", "setdefault", "update",
                                              "clear", "copy",    "fromkeys"};
constexpr std::string_view kListMethods[] = {"index", "count"};
constexpr std::string_view kListMutators[] = {"append",  "extend", "insert", "pop", "remove",
                                              "reverse", "sort",   "clear",  "copy"};

template <size_t N>
bool In(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

Value Unsafe(const Value& object, const std::string& name) {
  const std::string message =
      "access to attribute '" + name + "' of '" + object.TypeName() + "' object is unsafe.";
  return Value::MakeCallable("unsafe " + name, [message](CallArgs&) -> Value {
    throw JinjaError(JinjaError::Kind::kSecurity, message);
  });
}

Value DictMethod(const Value& self, const std::string& name, CallArgs& args) {
  List out;
  if (name == "get") {
    const Value* found = self.dict().Find(args.Get(0, "key"));
    return found != nullptr ? *found : args.Get(1, "default", Value::None());
  }
  for (const auto& [k, v] : self.dict().items) {
    if (name == "items") {
      out.push_back(Value::MakeList({k, v}, /*tuple=*/true));
    } else {
      out.push_back(name == "keys" ? k : v);
    }
  }
  return Value::MakeList(std::move(out));
}

Value ListMethod(const Value& self, const std::string& name, CallArgs& args) {
  const Value item = args.Get(0, "value");
  int64_t count = 0;
  for (size_t i = 0; i < self.list().size(); ++i) {
    if (self.list()[i].Equals(item)) {
      if (name == "index") return Value::Int(static_cast<int64_t>(i));
      ++count;
    }
  }
  if (name == "index") ThrowType(item.Repr() + " is not in list");
  return Value::Int(count);
}

Value Bind(const Value& self, const std::string& name,
           Value (*method)(const Value&, const std::string&, CallArgs&)) {
  return Value::MakeCallable(
      "method '" + name + "' of " + self.TypeName(),
      [self, name, method](CallArgs& args) { return method(self, name, args); });
}

}  // namespace

Value GetAttribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) object.ThrowUndefined();
  if (!name.empty() && name[0] == '_') return Unsafe(object, name);
  switch (object.kind()) {
    case Value::Kind::kString:
      if (In(kStringMethods, name)) return Bind(object, name, StringMethod);
      break;
    case Value::Kind::kDict:
      if (In(kDictMethods, name)) return Bind(object, name, DictMethod);
      if (In(kDictMutators, name)) return Unsafe(object, name);
      if (const Value* found = object.dict().Find(std::string_view(name))) return *found;
      break;
    case Value::Kind::kList:
      if (object.is_generator()) break;
      if (In(kListMethods, name)) return Bind(object, name, ListMethod);
      if (In(kListMutators, name)) return Unsafe(object, name);
      break;
    case Value::Kind::kNamespace:
      if (const Value* found = object.dict().Find(std::string_view(name))) return *found;
      break;
    default: break;
  }
  return Value::Undefined("'" + object.ObjectDescription() + "' has no attribute '" + name + "'");
}

}  // namespace tandem::chat::jinja
