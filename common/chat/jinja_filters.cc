// jinja2's filters and tests as transformers' environment has them (its own tojson included), and
// the globals: range, dict, namespace, joiner, raise_exception, strftime_now.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "common/chat/jinja_builtins.h"

namespace tandem::chat::jinja {
namespace {

using Filter = Value (*)(const Value& value, CallArgs& args);
using Test = bool (*)(const Value& value, CallArgs& args);

[[noreturn]] void FilterArgumentError(const std::string& message) { ThrowType(message); }

// jinja2's make_attrgetter: "a.b.0" walks items (integer parts as integers).
Value AttributePath(const Value& item, const Value& attribute, const Value& fallback = Value()) {
  if (attribute.is_none() || attribute.is_undefined()) return item;
  std::vector<Value> parts;
  if (attribute.is_string()) {
    const std::string& path = attribute.string_value();
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      std::string part =
          path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                       [](char c) { return c >= '0' && c <= '9'; });
      parts.push_back(digits ? Value::Int(std::stoll(part)) : Value::String(part));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  } else {
    parts.push_back(attribute);
  }
  Value current = item;
  for (const Value& part : parts) {
    current = GetItem(current, part);
    if (!fallback.is_none() && !fallback.is_undefined() && current.is_undefined())
      current = fallback;
  }
  return current;
}

Value IgnoreCase(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(PythonLower(v.string_value()));
  return v;
}

// Python's sorted() with a key; stable; raises TypeError for unorderable keys.
void SortByKey(List& items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? keys[b].Less(keys[a]) : keys[a].Less(keys[b]);
  });
  List sorted;
  for (size_t i : order) sorted.push_back(items[i]);
  items = std::move(sorted);
}

Value FilterLength(const Value& v, CallArgs&) { return Value::Int(Length(v)); }

Value FilterString(const Value& v, CallArgs&) { return v.is_string() ? v : Value::String(v.Str()); }

Value FilterTrim(const Value& v, CallArgs& args) {
  args.CheckKnown("trim", {"chars"});
  const Value chars = args.Get(0, "chars", Value::None());
  CallArgs strip_args;
  strip_args.positional.push_back(chars);
  return GetAttribute(Value::String(v.Str()), "strip").callable().function(strip_args);
}

Value FilterDefault(const Value& v, CallArgs& args) {
  args.CheckKnown("default", {"default_value", "boolean"});
  const Value fallback = args.Get(0, "default_value", Value::String(""));
  if (v.is_undefined() || (args.Get(1, "boolean", Value::Bool(false)).Truthy() && !v.Truthy()))
    return fallback;
  return v;
}

Value FilterJoin(const Value& v, CallArgs& args) {
  args.CheckKnown("join", {"d", "attribute"});
  const std::string separator = args.Get(0, "d", Value::String("")).Str();
  const Value attribute = args.Get(1, "attribute", Value::None());
  std::string out;
  bool first = true;
  for (const Value& item : Iterate(v)) {
    if (!first) out += separator;
    first = false;
    out += AttributePath(item, attribute).Str();
  }
  return Value::String(std::move(out));
}

Value FilterItems(const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::MakeGenerator({});
  if (!v.is_dict()) FilterArgumentError("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, item] : v.dict().items) out.push_back(Value::MakeList({k, item}, true));
  return Value::MakeGenerator(std::move(out));
}

Value FilterList(const Value& v, CallArgs&) { return Value::MakeList(Iterate(v)); }

Value FilterFirst(const Value& v, CallArgs&) {
  List items = Iterate(v);
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

Value FilterLast(const Value& v, CallArgs&) {
  if (v.is_generator()) ThrowType("'generator' object is not reversible");
  List items = Iterate(v);
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

Value FilterReverse(const Value& v, CallArgs&) {
  if (v.is_string()) {
    std::u32string cps = DecodeUtf8(v.string_value());
    std::reverse(cps.begin(), cps.end());
    return Value::String(EncodeUtf8(cps));
  }
  List items = Iterate(v);
  std::reverse(items.begin(), items.end());
  if (v.is_generator()) return Value::MakeList(std::move(items));
  return Value::MakeGenerator(std::move(items));
}

Value FilterLower(const Value& v, CallArgs&) { return Value::String(PythonLower(v.Str())); }
Value FilterUpper(const Value& v, CallArgs&) { return Value::String(PythonUpper(v.Str())); }
Value FilterCapitalize(const Value& v, CallArgs&) {
  return Value::String(PythonCapitalize(v.Str()));
}

// jinja2's title: words begin after runs of -, whitespace, ( { [ <; first letter upper, rest lower.
Value FilterTitle(const Value& v, CallArgs&) {
  const std::u32string cps = DecodeUtf8(v.Str());
  std::string out;
  auto separator = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPythonSpace(c);
  };
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    const bool sep = separator(cps[i]);
    while (j < cps.size() && separator(cps[j]) == sep) ++j;
    const std::string piece = EncodeUtf8(std::u32string_view(cps).substr(i, j - i));
    if (sep) {
      out += piece;
    } else {
      std::string head;
      AppendUtf8(cps[i], &head);
      out += PythonUpper(head) +
             PythonLower(EncodeUtf8(std::u32string_view(cps).substr(i + 1, j - i - 1)));
    }
    i = j;
  }
  return Value::String(std::move(out));
}

Value FilterReplace(const Value& v, CallArgs& args) {
  args.CheckKnown("replace", {"old", "new", "count"});
  CallArgs method_args;
  method_args.positional = {Value::String(args.Get(0, "old").Str()),
                            Value::String(args.Get(1, "new").Str())};
  const Value count = args.Get(2, "count", Value::None());
  if (!count.is_none()) method_args.positional.push_back(count);
  return GetAttribute(Value::String(v.Str()), "replace").callable().function(method_args);
}

Value FilterSafe(const Value& v, CallArgs&) { return v.is_markup() ? v : Value::Markup(v.Str()); }

Value FilterEscape(const Value& v, CallArgs&) {
  if (v.is_markup()) return v;
  return Value::Markup(HtmlEscape(v.Str()));
}

Value FilterForceEscape(const Value& v, CallArgs&) { return Value::Markup(HtmlEscape(v.Str())); }

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
Value FilterToJson(const Value& v, CallArgs& args) {
  args.CheckKnown("tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions options;
  const bool ensure_ascii = args.Get(0, "ensure_ascii", Value::Bool(false)).Truthy();
  const Value indent = args.Get(1, "indent", Value::None());
  if (indent.is_int()) {
    options.has_indent = true;
    options.indent =
        std::string(static_cast<size_t>(std::max<int64_t>(0, indent.int_value())), ' ');
  } else if (indent.is_string()) {
    options.has_indent = true;
    options.indent = indent.string_value();
  } else if (!indent.is_none()) {
    ThrowType("tojson: indent must be an int or a string");
  }
  if (options.has_indent) options.item_separator = ",";
  const Value separators = args.Get(2, "separators", Value::None());
  if (!separators.is_none()) {
    if (!separators.is_sequence() || separators.list().size() != 2 ||
        !separators.list()[0].is_string() || !separators.list()[1].is_string()) {
      ThrowType("tojson: separators must be a pair of strings");
    }
    options.item_separator = separators.list()[0].string_value();
    options.key_separator = separators.list()[1].string_value();
  }
  options.sort_keys = args.Get(3, "sort_keys", Value::Bool(false)).Truthy();
  std::string json = ToJson(v, options);
  if (!ensure_ascii) return Value::String(std::move(json));
  std::string out;
  for (char32_t cp : DecodeUtf8(json)) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
      continue;
    }
    char buffer[16];
    auto unit = [&](unsigned u) {
      std::snprintf(buffer, sizeof(buffer), "\\u%04x", u);
      out += buffer;
    };
    if (cp >= 0x10000) {
      const unsigned c = static_cast<unsigned>(cp) - 0x10000;
      unit(0xD800 + (c >> 10));
      unit(0xDC00 + (c & 0x3FF));
    } else {
      unit(static_cast<unsigned>(cp));
    }
  }
  return Value::String(std::move(out));
}

bool ParsePythonInt(const std::string& raw, int base, int64_t& out) {
  // int(str, base): surrounding whitespace, a sign, underscores between digits.
  const std::string text = StripPython(raw, /*left=*/true, /*right=*/true);
  if (text.empty()) return false;
  bool negative = false;
  size_t i = 0;
  if (text[0] == '+' || text[0] == '-') {
    negative = text[0] == '-';
    i = 1;
  }
  if (i == text.size()) return false;
  int64_t value = 0;
  bool previous_underscore = true;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') {
      if (previous_underscore) return false;
      previous_underscore = true;
      continue;
    }
    int digit = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'z' ? c - 'a' + 10
                : c >= 'A' && c <= 'Z' ? c - 'A' + 10
                                       : 99;
    if (digit >= base) return false;
    if (__builtin_mul_overflow(value, base, &value) || __builtin_add_overflow(value, digit, &value))
      return false;
    previous_underscore = false;
  }
  if (previous_underscore) return false;
  out = negative ? -value : value;
  return true;
}

bool ParsePythonFloat(const std::string& text, double& out) {
  const std::string t = StripPython(text, /*left=*/true, /*right=*/true);
  if (t.empty()) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

Value FilterInt(const Value& v, CallArgs& args) {
  args.CheckKnown("int", {"default", "base"});
  const Value fallback = args.Get(0, "default", Value::Int(0));
  const int base = static_cast<int>(args.Get(1, "base", Value::Int(10)).int_value());
  if (v.is_int() || v.is_bool()) return Value::Int(v.int_value());
  if (v.is_float()) {
    if (!std::isfinite(v.float_value()))
      ThrowType("cannot convert float infinity or NaN to integer");
    return Value::Int(static_cast<int64_t>(std::trunc(v.float_value())));
  }
  if (v.is_string()) {
    int64_t i = 0;
    if (ParsePythonInt(v.string_value(), base, i)) return Value::Int(i);
    double f = 0;
    if (ParsePythonFloat(v.string_value(), f) && std::isfinite(f))
      return Value::Int(static_cast<int64_t>(std::trunc(f)));
  }
  return fallback;
}

Value FilterFloat(const Value& v, CallArgs& args) {
  args.CheckKnown("float", {"default"});
  if (v.is_number()) return Value::Float(v.AsDouble());
  double f = 0;
  if (v.is_string() && ParsePythonFloat(v.string_value(), f)) return Value::Float(f);
  return args.Get(0, "default", Value::Float(0.0));
}

Value FilterAbs(const Value& v, CallArgs&) {
  if (v.is_float()) return Value::Float(std::fabs(v.float_value()));
  if (v.is_number()) return Value::Int(std::llabs(v.int_value()));
  ThrowType("bad operand type for abs(): '" + v.TypeName() + "'");
}

Value FilterRound(const Value& v, CallArgs& args) {
  args.CheckKnown("round", {"precision", "method"});
  const int64_t precision = args.Get(0, "precision", Value::Int(0)).int_value();
  const std::string method = args.Get(1, "method", Value::String("common")).Str();
  if (!v.is_number()) ThrowType("type " + v.TypeName() + " doesn't define __round__ method");
  const double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.AsDouble() * scale;
  if (method == "common") {
    x = std::nearbyint(x);  // round half to even, as Python's round()
  } else if (method == "ceil") {
    x = std::ceil(x);
  } else if (method == "floor") {
    x = std::floor(x);
  } else {
    FilterArgumentError("method must be common, ceil or floor");
  }
  if (v.is_int() && method == "common" && precision >= 0) return Value::Int(v.int_value());
  return Value::Float(x / scale);
}

// jinja2's indent: the first line unindented unless `first`, blank lines left alone unless `blank`.
Value FilterIndent(const Value& v, CallArgs& args) {
  args.CheckKnown("indent", {"width", "first", "blank"});
  const Value width = args.Get(0, "width", Value::Int(4));
  const std::string indentation =
      width.is_string()
          ? width.string_value()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, width.int_value())), ' ');
  const bool first = args.Get(1, "first", Value::Bool(false)).Truthy();
  const bool blank = args.Get(2, "blank", Value::Bool(false)).Truthy();
  std::vector<std::string> lines = PythonSplitLines(v.Str() + "\n", false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + indentation : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i)
      rv += "\n" + (lines[i].empty() ? "" : indentation + lines[i]);
  }
  if (first) rv = indentation + rv;
  return Value::String(std::move(rv));
}

Value FilterCenter(const Value& v, CallArgs& args) {
  const int64_t width = args.Get(0, "width", Value::Int(80)).int_value();
  const std::string s = v.Str();
  const int64_t length = static_cast<int64_t>(CodePointLength(s));
  if (width <= length) return Value::String(s);
  const int64_t margin = width - length;
  const int64_t left = margin / 2 + (margin & width & 1);
  return Value::String(std::string(static_cast<size_t>(left), ' ') + s +
                       std::string(static_cast<size_t>(margin - left), ' '));
}

Value FilterWordCount(const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t cp : DecodeUtf8(v.Str())) {
    const bool word =
        cp == '_' || (cp < 0x80 ? std::isalnum(static_cast<int>(cp)) != 0 : !IsPythonSpace(cp));
    n += word && !in_word;
    in_word = word;
  }
  return Value::Int(n);
}

Value FilterFormat(const Value& v, CallArgs& args) {
  if (!args.keyword.empty())
    throw JinjaError(JinjaError::Kind::kUnsupported,
                     "format with keyword arguments is not supported");
  return BinaryOp("%", Value::String(v.Str()), Value::MakeList(args.positional, /*tuple=*/true));
}

Value FilterSum(const Value& v, CallArgs& args) {
  args.CheckKnown("sum", {"attribute", "start"});
  const Value attribute = args.Get(0, "attribute", Value::None());
  Value total = args.Get(1, "start", Value::Int(0));
  for (const Value& item : Iterate(v)) total = BinaryOp("+", total, AttributePath(item, attribute));
  return total;
}

Value FilterDictSort(const Value& v, CallArgs& args) {
  args.CheckKnown("dictsort", {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) ThrowType("dictsort: a mapping is required");
  const bool case_sensitive = args.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
  const std::string by = args.Get(1, "by", Value::String("key")).Str();
  if (by != "key" && by != "value")
    FilterArgumentError("You can only sort by either \"key\" or \"value\"");
  List items;
  std::vector<Value> keys;
  for (const auto& [k, item] : v.dict().items) {
    items.push_back(Value::MakeList({k, item}, true));
    keys.push_back(IgnoreCase(by == "key" ? k : item, case_sensitive));
  }
  SortByKey(items, keys, args.Get(2, "reverse", Value::Bool(false)).Truthy());
  return Value::MakeList(std::move(items));
}

Value FilterSort(const Value& v, CallArgs& args) {
  args.CheckKnown("sort", {"reverse", "case_sensitive", "attribute"});
  const bool reverse = args.Get(0, "reverse", Value::Bool(false)).Truthy();
  const bool case_sensitive = args.Get(1, "case_sensitive", Value::Bool(false)).Truthy();
  const Value attribute = args.Get(2, "attribute", Value::None());
  List items = Iterate(v);
  std::vector<Value> keys;
  for (const Value& item : items)
    keys.push_back(IgnoreCase(AttributePath(item, attribute), case_sensitive));
  SortByKey(items, keys, reverse);
  return Value::MakeList(std::move(items));
}

Value FilterUnique(const Value& v, CallArgs& args) {
  args.CheckKnown("unique", {"case_sensitive", "attribute"});
  const bool case_sensitive = args.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
  const Value attribute = args.Get(1, "attribute", Value::None());
  List out, seen;
  for (const Value& item : Iterate(v)) {
    const Value key = IgnoreCase(AttributePath(item, attribute), case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return s.Equals(key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::MakeGenerator(std::move(out));
}

Value MinMax(const Value& v, CallArgs& args, bool max) {
  args.CheckKnown(max ? "max" : "min", {"case_sensitive", "attribute"});
  const bool case_sensitive = args.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
  const Value attribute = args.Get(1, "attribute", Value::None());
  List items = Iterate(v);
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = IgnoreCase(AttributePath(items[0], attribute), case_sensitive);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = IgnoreCase(AttributePath(items[i], attribute), case_sensitive);
    if (max ? best_key.Less(key) : key.Less(best_key)) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}
Value FilterMin(const Value& v, CallArgs& args) { return MinMax(v, args, false); }
Value FilterMax(const Value& v, CallArgs& args) { return MinMax(v, args, true); }

Value SelectOrReject(const Value& v, CallArgs& args, bool lookup_attribute, bool select) {
  if (!v.Truthy()) return Value::MakeGenerator({});
  size_t offset = 0;
  Value attribute;
  if (lookup_attribute) {
    if (args.positional.empty()) FilterArgumentError("Missing parameter for attribute name");
    attribute = args.positional[0];
    offset = 1;
  }
  const bool has_test = args.positional.size() > offset;
  std::string test_name = has_test ? args.positional[offset].Str() : "";
  if (has_test && !HasTest(test_name))
    throw JinjaError(JinjaError::Kind::kUnsupported, "no test named '" + test_name + "'");
  CallArgs test_args;
  if (has_test) {
    test_args.positional.assign(args.positional.begin() + static_cast<long>(offset) + 1,
                                args.positional.end());
    test_args.keyword = args.keyword;
  }
  List out;
  for (const Value& item : Iterate(v)) {
    const Value subject = lookup_attribute ? AttributePath(item, attribute) : item;
    CallArgs call = test_args;
    const bool passed = has_test ? ApplyTest(test_name, subject, call) : subject.Truthy();
    if (passed == select) out.push_back(item);
  }
  return Value::MakeGenerator(std::move(out));
}
Value FilterSelect(const Value& v, CallArgs& args) { return SelectOrReject(v, args, false, true); }
Value FilterReject(const Value& v, CallArgs& args) { return SelectOrReject(v, args, false, false); }
Value FilterSelectAttr(const Value& v, CallArgs& args) {
  return SelectOrReject(v, args, true, true);
}
Value FilterRejectAttr(const Value& v, CallArgs& args) {
  return SelectOrReject(v, args, true, false);
}

Value FilterMap(const Value& v, CallArgs& args) {
  if (!v.Truthy()) return Value::MakeGenerator({});
  List out;
  if (args.positional.empty()) {
    Value attribute, fallback;
    for (const auto& [key, value] : args.keyword) {
      if (key == "attribute") {
        attribute = value;
      } else if (key == "default") {
        fallback = value;
      } else {
        FilterArgumentError("Unexpected keyword argument '" + key + "'");
      }
    }
    if (attribute.is_undefined()) FilterArgumentError("map requires a filter name or attribute=");
    for (const Value& item : Iterate(v)) out.push_back(AttributePath(item, attribute, fallback));
    return Value::MakeGenerator(std::move(out));
  }
  const std::string name = args.positional[0].Str();
  if (!HasFilter(name))
    throw JinjaError(JinjaError::Kind::kUnsupported, "no filter named '" + name + "'");
  CallArgs filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.keyword = args.keyword;
  for (const Value& item : Iterate(v)) {
    CallArgs call = filter_args;
    out.push_back(ApplyFilter(name, item, call));
  }
  return Value::MakeGenerator(std::move(out));
}

Value FilterAttr(const Value& v, CallArgs& args) {
  return GetAttribute(v, args.Get(0, "name").Str());
}

Value FilterBatch(const Value& v, CallArgs& args) {
  const int64_t size = args.Get(0, "linecount").int_value();
  if (size <= 0) FilterArgumentError("batch size must be positive");
  const Value fill = args.Get(1, "fill_with", Value::None());
  List out, row;
  for (const Value& item : Iterate(v)) {
    row.push_back(item);
    if (static_cast<int64_t>(row.size()) == size) {
      out.push_back(Value::MakeList(std::move(row)));
      row.clear();
    }
  }
  if (!row.empty()) {
    if (!fill.is_none()) {
      while (static_cast<int64_t>(row.size()) < size) row.push_back(fill);
    }
    out.push_back(Value::MakeList(std::move(row)));
  }
  return Value::MakeGenerator(std::move(out));
}

struct NamedFilter {
  std::string_view name;
  Filter filter;
};

constexpr NamedFilter kFilters[] = {
    {"abs", FilterAbs},
    {"attr", FilterAttr},
    {"batch", FilterBatch},
    {"capitalize", FilterCapitalize},
    {"center", FilterCenter},
    {"count", FilterLength},
    {"d", FilterDefault},
    {"default", FilterDefault},
    {"dictsort", FilterDictSort},
    {"e", FilterEscape},
    {"escape", FilterEscape},
    {"first", FilterFirst},
    {"float", FilterFloat},
    {"forceescape", FilterForceEscape},
    {"format", FilterFormat},
    {"indent", FilterIndent},
    {"int", FilterInt},
    {"items", FilterItems},
    {"join", FilterJoin},
    {"last", FilterLast},
    {"length", FilterLength},
    {"list", FilterList},
    {"lower", FilterLower},
    {"map", FilterMap},
    {"max", FilterMax},
    {"min", FilterMin},
    {"reject", FilterReject},
    {"rejectattr", FilterRejectAttr},
    {"replace", FilterReplace},
    {"reverse", FilterReverse},
    {"round", FilterRound},
    {"safe", FilterSafe},
    {"select", FilterSelect},
    {"selectattr", FilterSelectAttr},
    {"sort", FilterSort},
    {"string", FilterString},
    {"sum", FilterSum},
    {"title", FilterTitle},
    {"tojson", FilterToJson},
    {"trim", FilterTrim},
    {"unique", FilterUnique},
    {"upper", FilterUpper},
    {"wordcount", FilterWordCount},
};

bool Compare(std::string_view op, const Value& a, const Value& b) {
  if (op == "==" || op == "eq" || op == "equalto") return a.Equals(b);
  if (op == "!=" || op == "ne") return !a.Equals(b);
  if (op == "<" || op == "lt" || op == "lessthan") return a.Less(b);
  if (op == "<=" || op == "le") return !b.Less(a);
  if (op == ">" || op == "gt" || op == "greaterthan") return b.Less(a);
  return !a.Less(b);  // >=, ge
}

bool TestDefined(const Value& v, CallArgs&) { return !v.is_undefined(); }
bool TestUndefined(const Value& v, CallArgs&) { return v.is_undefined(); }
bool TestNone(const Value& v, CallArgs&) { return v.is_none(); }
bool TestBoolean(const Value& v, CallArgs&) { return v.is_bool(); }
bool TestTrue(const Value& v, CallArgs&) { return v.is_bool() && v.bool_value(); }
bool TestFalse(const Value& v, CallArgs&) { return v.is_bool() && !v.bool_value(); }
bool TestInteger(const Value& v, CallArgs&) { return v.is_int(); }
bool TestFloat(const Value& v, CallArgs&) { return v.is_float(); }
bool TestNumber(const Value& v, CallArgs&) { return v.is_number(); }
bool TestString(const Value& v, CallArgs&) { return v.is_string(); }
bool TestMapping(const Value& v, CallArgs&) { return v.is_dict(); }
bool TestSequence(const Value& v, CallArgs&) {
  return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined();
}
bool TestIterable(const Value& v, CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool TestCallable(const Value& v, CallArgs&) { return v.is_callable(); }
int64_t IntForTest(const Value& v) {
  if (!v.is_number())
    ThrowType("unsupported operand type(s) for %: '" + v.TypeName() + "' and 'int'");
  return v.is_float() ? static_cast<int64_t>(v.float_value()) : v.int_value();
}
bool TestOdd(const Value& v, CallArgs&) { return IntForTest(v) % 2 != 0; }
bool TestEven(const Value& v, CallArgs&) { return IntForTest(v) % 2 == 0; }
bool TestDivisibleBy(const Value& v, CallArgs& args) {
  const Value n = args.Get(0, "num");
  if (!n.is_number() || n.AsDouble() == 0) ThrowType("integer division or modulo by zero");
  return BinaryOp("%", v, n).AsDouble() == 0;
}
bool TestIn(const Value& v, CallArgs& args) { return Contains(args.Get(0, "seq"), v); }
bool TestLower(const Value& v, CallArgs&) {
  CallArgs none;
  return GetAttribute(Value::String(v.Str()), "islower").callable().function(none).Truthy();
}
bool TestUpper(const Value& v, CallArgs&) {
  CallArgs none;
  return GetAttribute(Value::String(v.Str()), "isupper").callable().function(none).Truthy();
}
bool TestSameAs(const Value& v, CallArgs& args) {
  const Value other = args.Get(0, "other");
  if (v.kind() != other.kind()) return false;
  if (v.is_none() || v.is_bool() || v.is_int() || v.is_undefined()) return v.Equals(other);
  if (v.is_string() || v.is_float()) return false;
  return v.Equals(other) && !v.is_sequence() && !v.is_dict();
}
bool TestEscaped(const Value&, CallArgs&) { return false; }
bool TestFilter(const Value& v, CallArgs&) { return v.is_string() && HasFilter(v.string_value()); }
bool TestTest(const Value& v, CallArgs&) { return v.is_string() && HasTest(v.string_value()); }

struct NamedTest {
  std::string_view name;
  Test test;
};

constexpr NamedTest kTests[] = {
    {"boolean", TestBoolean},
    {"callable", TestCallable},
    {"defined", TestDefined},
    {"divisibleby", TestDivisibleBy},
    {"escaped", TestEscaped},
    {"even", TestEven},
    {"false", TestFalse},
    {"filter", TestFilter},
    {"float", TestFloat},
    {"in", TestIn},
    {"integer", TestInteger},
    {"iterable", TestIterable},
    {"lower", TestLower},
    {"mapping", TestMapping},
    {"none", TestNone},
    {"number", TestNumber},
    {"odd", TestOdd},
    {"sameas", TestSameAs},
    {"sequence", TestSequence},
    {"string", TestString},
    {"test", TestTest},
    {"true", TestTrue},
    {"undefined", TestUndefined},
    {"upper", TestUpper},
};

constexpr std::string_view kComparisonTests[] = {"==", "!=", "<",       "<=",       ">",
                                                 ">=", "eq", "ne",      "lt",       "le",
                                                 "gt", "ge", "equalto", "lessthan", "greaterthan"};

}  // namespace

bool HasFilter(std::string_view name) {
  return std::any_of(std::begin(kFilters), std::end(kFilters),
                     [&](const NamedFilter& f) { return f.name == name; });
}

bool HasTest(std::string_view name) {
  return std::any_of(std::begin(kTests), std::end(kTests),
                     [&](const NamedTest& t) { return t.name == name; }) ||
         std::find(std::begin(kComparisonTests), std::end(kComparisonTests), name) !=
             std::end(kComparisonTests);
}

Value ApplyFilter(std::string_view name, const Value& value, CallArgs& args) {
  for (const NamedFilter& f : kFilters) {
    if (f.name == name) return f.filter(value, args);
  }
  throw JinjaError(JinjaError::Kind::kUnsupported, "no filter named '" + std::string(name) + "'");
}

bool ApplyTest(std::string_view name, const Value& value, CallArgs& args) {
  for (const NamedTest& t : kTests) {
    if (t.name == name) return t.test(value, args);
  }
  if (std::find(std::begin(kComparisonTests), std::end(kComparisonTests), name) !=
      std::end(kComparisonTests)) {
    return Compare(name, value, args.Get(0, "other"));
  }
  throw JinjaError(JinjaError::Kind::kUnsupported, "no test named '" + std::string(name) + "'");
}

namespace {

// The sandbox caps range() at 100,000 items.
constexpr int64_t kMaxRange = 100000;

Value Range(CallArgs& args) {
  if (!args.keyword.empty()) ThrowType("range() takes no keyword arguments");
  std::vector<int64_t> a;
  for (const Value& v : args.positional) {
    if (!v.is_int() && !v.is_bool())
      ThrowType("'" + v.TypeName() + "' object cannot be interpreted as an integer");
    a.push_back(v.int_value());
  }
  if (a.empty() || a.size() > 3) ThrowType("range expected at most 3 arguments");
  const int64_t start = a.size() == 1 ? 0 : a[0];
  const int64_t stop = a.size() == 1 ? a[0] : a[1];
  const int64_t step = a.size() == 3 ? a[2] : 1;
  if (step == 0) ThrowType("range() arg 3 must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      throw JinjaError(JinjaError::Kind::kSecurity,
                       "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    out.push_back(Value::Int(i));
  }
  return Value::MakeList(std::move(out));
}

Dict KeywordDict(const CallArgs& args, const char* function) {
  Dict dict;
  if (args.positional.size() > 1)
    ThrowType(std::string(function) + " expected at most 1 positional argument");
  if (!args.positional.empty()) {
    const Value& initial = args.positional[0];
    if (initial.is_dict()) {
      dict = initial.dict();
    } else {
      for (const Value& pair : Iterate(initial)) {
        if (!pair.is_sequence() || pair.list().size() != 2)
          ThrowType("dictionary update sequence element has wrong length");
        dict.Set(pair.list()[0], pair.list()[1]);
      }
    }
  }
  for (const auto& [key, value] : args.keyword) dict.Set(Value::String(key), value);
  return dict;
}

Value Joiner(CallArgs& args) {
  const std::string separator = args.Get(0, "sep", Value::String(", ")).Str();
  auto used = std::make_shared<bool>(false);
  return Value::MakeCallable("joiner", [separator, used](CallArgs&) {
    if (!*used) {
      *used = true;
      return Value::String("");
    }
    return Value::String(separator);
  });
}

Value RaiseException(CallArgs& args) {
  throw JinjaError(JinjaError::Kind::kRaised, args.Get(0, "message").Str());
}

Value StrftimeNow(CallArgs& args) {
  const std::string format = args.Get(0, "format").Str();
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string buffer(256 + format.size() * 8, '\0');
  const size_t n = std::strftime(buffer.data(), buffer.size(), format.c_str(), &local);
  buffer.resize(n);
  return Value::String(std::move(buffer));
}

}  // namespace

Dict MakeGlobals() {
  Dict globals;
  auto add = [&](const char* name, NativeFunction fn) {
    globals.items.emplace_back(Value::String(name), Value::MakeCallable(name, std::move(fn)));
  };
  add("range", Range);
  add("dict", [](CallArgs& args) { return Value::MakeDict(KeywordDict(args, "dict")); });
  add("namespace",
      [](CallArgs& args) { return Value::MakeNamespace(KeywordDict(args, "namespace")); });
  add("joiner", Joiner);
  add("raise_exception", RaiseException);
  add("strftime_now", StrftimeNow);
  return globals;
}

}  // namespace tandem::chat::jinja
