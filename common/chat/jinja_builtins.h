// What jinja2 (in transformers' sandbox) provides to a template: Python's operators and attribute
// and item access on the values (jinja_operators.cc), and the filters and tests (jinja_filters.cc).
// Everything here throws JinjaError; the interpreter (jinja.cc) runs the statements.
#ifndef TANDEM_COMMON_CHAT_JINJA_BUILTINS_H_
#define TANDEM_COMMON_CHAT_JINJA_BUILTINS_H_

#include <string>
#include <string_view>
#include <vector>

#include "common/chat/jinja_value.h"

namespace tandem::chat::jinja {

// Operators: + - * / // % ** ~ (op as written) and `in`.
Value BinaryOp(std::string_view op, const Value& left, const Value& right);
bool Contains(const Value& container, const Value& item);
Value Negate(const Value& value);

// `object.name`: Python attributes first (str, dict and list methods, namespace attributes), then
// the dict key; an Undefined naming what was missing otherwise. Mutating methods (list.append,
// dict.update, ...) are refused when called, as ImmutableSandboxedEnvironment refuses them.
Value GetAttribute(const Value& object, const std::string& name);
// `object[key]`: the item first, then (for a string key) the attribute.
Value GetItem(const Value& object, const Value& key);
// `object[start:stop:step]` on strings, lists and tuples (null values: omitted).
Value GetSlice(const Value& object, const Value& start, const Value& stop, const Value& step);
// The items a for loop or a filter walks: list items, dict keys, string code points; nothing for
// undefined; TypeError for what Python cannot iterate.
List Iterate(const Value& value);
// Python's len().
int64_t Length(const Value& value);

// Python's str.lower/upper/title/capitalize (simple case mappings) and str.splitlines.
std::string PythonLower(const std::string& s);
std::string PythonUpper(const std::string& s);
std::string PythonTitle(const std::string& s);
std::string PythonCapitalize(const std::string& s);
std::vector<std::string> PythonSplitLines(const std::string& s, bool keep_ends);

bool HasFilter(std::string_view name);
bool HasTest(std::string_view name);
Value ApplyFilter(std::string_view name, const Value& value, CallArgs& args);
bool ApplyTest(std::string_view name, const Value& value, CallArgs& args);

// `range`, `dict`, `namespace`, `raise_exception`, `strftime_now`, `cycler`, `joiner`.
Dict MakeGlobals();

}  // namespace tandem::chat::jinja

#endif  // TANDEM_COMMON_CHAT_JINJA_BUILTINS_H_
