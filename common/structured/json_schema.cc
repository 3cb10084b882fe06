#include "common/structured/json_schema.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace tandem::structured {
namespace {

using json = nlohmann::ordered_json;
using Symbol = GrammarBuilder::Symbol;
using Sequence = GrammarBuilder::Sequence;

constexpr int kMaxSchemaDepth = 64;
constexpr size_t kMaxRules = 200000;

// Keywords that only describe: ignored.
const absl::flat_hash_set<std::string>& Annotations() {
  static const auto* k = new absl::flat_hash_set<std::string>{
      "title",    "description", "default",       "examples",         "$schema", "$id",
      "$comment", "deprecated",  "readOnly",      "writeOnly",        "$defs",   "definitions",
      "$anchor",  "strict",      "discriminator", "contentMediaType", "name"};
  return *k;
}
// Keywords this compiler enforces.
const absl::flat_hash_set<std::string>& Supported() {
  static const auto* k = new absl::flat_hash_set<std::string>{
      "type",  "enum",     "const",      "anyOf",     "oneOf",
      "allOf", "$ref",     "properties", "required",  "additionalProperties",
      "items", "minItems", "maxItems",   "minLength", "maxLength"};
  return *k;
}

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) {}

  absl::StatusOr<Grammar> Compile() {
    ASSIGN_OR_RETURN(Symbol value, Schema(root_, "#", 0));
    const uint32_t top = b_.NewRule("root");
    b_.AddAlternative(top, {Ws(), value});
    if (b_.num_rules() > kMaxRules) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schema: the grammar would need ", b_.num_rules(), " rules (at most ", kMaxRules, ")"));
    }
    return b_.Build(top);
  }

  // Any JSON object, for json_object mode.
  Grammar AnyObject() {
    const uint32_t top = b_.NewRule("root");
    b_.AddAlternative(top, {Ws(), GrammarBuilder::Ref(AnyObjectRule())});
    return *b_.Build(top);
  }

 private:
  static absl::Status Refuse(const std::string& where, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("schema at ", where, ": ", why));
  }

  // Shared rules, made once.
  // Whitespace between tokens: nothing, one space, or a line break and an indent of at most
  // kMaxWhitespace spaces or tabs (what pretty printers write), so a model cannot spend its tokens
  // on blank space.
  Symbol Ws() {
    if (!ws_) {
      ByteClass indent;
      indent.Add(' ', ' ').Add('\t', '\t');
      const uint32_t r = b_.NewRule("ws");
      b_.AddAlternative(r, {});
      b_.AddAlternative(r, {GrammarBuilder::Byte(' ')});
      const uint32_t pad = *b_.Repeat("indent", GrammarBuilder::Bytes(indent), 0, kMaxWhitespace);
      b_.AddAlternative(r, {GrammarBuilder::Byte('\n'), GrammarBuilder::Ref(pad)});
      b_.AddAlternative(
          r, {GrammarBuilder::Byte('\r'), GrammarBuilder::Byte('\n'), GrammarBuilder::Ref(pad)});
      ws_ = r;
    }
    return GrammarBuilder::Ref(*ws_);
  }
  // One character of a string's body: unescaped UTF-8 or an escape.
  Symbol StringChar() {
    if (!string_char_) {
      const uint32_t r = b_.NewRule("char");
      ByteClass ascii;
      ascii.Add(0x20, 0x21).Add(0x23, 0x5B).Add(0x5D, 0x7F);
      b_.AddAlternative(r, {GrammarBuilder::Bytes(ascii)});
      auto range = [](uint8_t lo, uint8_t hi) {
        return GrammarBuilder::Bytes(ByteClass::Range(lo, hi));
      };
      const Symbol cont = range(0x80, 0xBF);
      b_.AddAlternative(r, {range(0xC2, 0xDF), cont});
      b_.AddAlternative(r, {GrammarBuilder::Byte(0xE0), range(0xA0, 0xBF), cont});
      ByteClass e1;
      e1.Add(0xE1, 0xEC).Add(0xEE, 0xEF);
      b_.AddAlternative(r, {GrammarBuilder::Bytes(e1), cont, cont});
      b_.AddAlternative(r, {GrammarBuilder::Byte(0xED), range(0x80, 0x9F), cont});
      b_.AddAlternative(r, {GrammarBuilder::Byte(0xF0), range(0x90, 0xBF), cont, cont});
      b_.AddAlternative(r, {range(0xF1, 0xF3), cont, cont, cont});
      b_.AddAlternative(r, {GrammarBuilder::Byte(0xF4), range(0x80, 0x8F), cont, cont});
      ByteClass simple;
      for (char e : std::string("\"\\/bfnrt")) simple.Add(e, e);
      b_.AddAlternative(r, {GrammarBuilder::Byte('\\'), GrammarBuilder::Bytes(simple)});
      ByteClass hex;
      hex.Add('0', '9').Add('a', 'f').Add('A', 'F');
      const Symbol h = GrammarBuilder::Bytes(hex);
      b_.AddAlternative(r, {GrammarBuilder::Byte('\\'), GrammarBuilder::Byte('u'), h, h, h, h});
      string_char_ = r;
    }
    return GrammarBuilder::Ref(*string_char_);
  }
  absl::StatusOr<Symbol> String(int64_t min_length, int64_t max_length) {
    const bool plain = min_length == 0 && max_length < 0;
    if (plain && any_string_) return GrammarBuilder::Ref(*any_string_);
    ASSIGN_OR_RETURN(uint32_t body,
                     b_.Repeat(absl::StrCat("string{", min_length, ",", max_length, "}"),
                               StringChar(), min_length, max_length));
    const uint32_t r = b_.NewRule("string");
    b_.AddAlternative(
        r, {GrammarBuilder::Byte('"'), GrammarBuilder::Ref(body), GrammarBuilder::Byte('"')});
    if (plain) any_string_ = r;
    return GrammarBuilder::Ref(r);
  }
  Symbol Digits() {  // [0-9]+
    if (!digits_) {
      const Symbol d = GrammarBuilder::Bytes(ByteClass::Range('0', '9'));
      const uint32_t r = b_.NewRule("digits");
      b_.AddAlternative(r, {d, GrammarBuilder::Ref(b_.Star("digits*", d))});
      digits_ = r;
    }
    return GrammarBuilder::Ref(*digits_);
  }
  Symbol Integer() {  // -?(0|[1-9][0-9]*)
    if (!integer_) {
      const uint32_t magnitude = b_.NewRule("natural");
      b_.AddAlternative(magnitude, GrammarBuilder::Literal("0"));
      b_.AddAlternative(
          magnitude, {GrammarBuilder::Bytes(ByteClass::Range('1', '9')),
                      GrammarBuilder::Ref(
                          b_.Star("natural*", GrammarBuilder::Bytes(ByteClass::Range('0', '9'))))});
      const uint32_t r = b_.NewRule("integer");
      b_.AddAlternative(r, {GrammarBuilder::Ref(magnitude)});
      b_.AddAlternative(r, {GrammarBuilder::Byte('-'), GrammarBuilder::Ref(magnitude)});
      integer_ = r;
    }
    return GrammarBuilder::Ref(*integer_);
  }
  Symbol Number() {  // integer (. digits)? ([eE] [+-]? digits)?
    if (!number_) {
      const uint32_t frac = b_.NewRule("frac");
      b_.AddAlternative(frac, {GrammarBuilder::Byte('.'), Digits()});
      b_.AddAlternative(frac, {});
      const uint32_t exp = b_.NewRule("exp");
      ByteClass e;
      e.Add('e', 'e').Add('E', 'E');
      ByteClass sign;
      sign.Add('+', '+').Add('-', '-');
      b_.AddAlternative(exp, {GrammarBuilder::Bytes(e), GrammarBuilder::Bytes(sign), Digits()});
      b_.AddAlternative(exp, {GrammarBuilder::Bytes(e), Digits()});
      b_.AddAlternative(exp, {});
      const uint32_t r = b_.NewRule("number");
      b_.AddAlternative(r, {Integer(), GrammarBuilder::Ref(frac), GrammarBuilder::Ref(exp)});
      number_ = r;
    }
    return GrammarBuilder::Ref(*number_);
  }
  // "," between items, with whitespace around.
  Sequence Comma() { return {Ws(), GrammarBuilder::Byte(','), Ws()}; }
  uint32_t AnyValueRule() {
    if (!any_value_) {
      const uint32_t r = b_.NewRule("value");
      any_value_ = r;  // before the parts: they refer to it
      b_.AddAlternative(r, {GrammarBuilder::Ref(AnyObjectRule())});
      b_.AddAlternative(r, {GrammarBuilder::Ref(AnyArrayRule())});
      b_.AddAlternative(r, {*String(0, -1)});
      b_.AddAlternative(r, {Number()});
      for (const char* lit : {"true", "false", "null"}) {
        b_.AddAlternative(r, GrammarBuilder::Literal(lit));
      }
    }
    return *any_value_;
  }
  uint32_t AnyObjectRule() {
    if (!any_object_) {
      const uint32_t r = b_.NewRule("object");
      any_object_ = r;
      const uint32_t member = b_.NewRule("member");
      b_.AddAlternative(member, {*String(0, -1), Ws(), GrammarBuilder::Byte(':'), Ws(),
                                 GrammarBuilder::Ref(AnyValueRule())});
      const uint32_t members =
          *b_.SeparatedRepeat("members", GrammarBuilder::Ref(member), Comma(), 0, -1);
      b_.AddAlternative(r, {GrammarBuilder::Byte('{'), Ws(), GrammarBuilder::Ref(members), Ws(),
                            GrammarBuilder::Byte('}')});
    }
    return *any_object_;
  }
  uint32_t AnyArrayRule() {
    if (!any_array_) {
      const uint32_t r = b_.NewRule("array");
      any_array_ = r;
      const uint32_t items =
          *b_.SeparatedRepeat("items", GrammarBuilder::Ref(AnyValueRule()), Comma(), 0, -1);
      b_.AddAlternative(r, {GrammarBuilder::Byte('['), Ws(), GrammarBuilder::Ref(items), Ws(),
                            GrammarBuilder::Byte(']')});
    }
    return *any_array_;
  }

  static absl::StatusOr<int64_t> Count(const json& s, const char* key, const std::string& where) {
    if (!s.contains(key)) return -1;
    const json& v = s[key];
    if (!v.is_number_integer() &&
        !(v.is_number_float() &&
          v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())))) {
      return Refuse(where, absl::StrCat(key, " must be a non-negative integer"));
    }
    const int64_t n =
        v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
    if (n < 0) return Refuse(where, absl::StrCat(key, " must be a non-negative integer"));
    return n;
  }

  absl::StatusOr<Symbol> Schema(const json& s, const std::string& where, int depth) {
    if (depth > kMaxSchemaDepth) {
      return Refuse(where, absl::StrCat("nested deeper than ", kMaxSchemaDepth, " levels"));
    }
    if (b_.num_rules() > kMaxRules) {
      return Refuse(where, absl::StrCat("the grammar would need more than ", kMaxRules, " rules"));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return GrammarBuilder::Ref(AnyValueRule());
      return Refuse(where, "the schema false matches nothing");
    }
    if (!s.is_object()) return Refuse(where, "a schema must be an object or a boolean");
    std::vector<std::string> validation;
    for (const auto& [key, value] : s.items()) {
      if (Annotations().contains(key)) continue;
      if (!Supported().contains(key)) {
        return Refuse(where, absl::StrCat("keyword '", key,
                                          "' is not supported by structured output (refused "
                                          "rather than ignored)"));
      }
      validation.push_back(key);
    }
    auto only = [&](std::initializer_list<const char*> allowed) -> absl::Status {
      for (const std::string& k : validation) {
        bool ok = false;
        for (const char* a : allowed) ok = ok || k == a;
        if (!ok) {
          return Refuse(where, absl::StrCat("keyword '", k, "' beside '", *allowed.begin(),
                                            "' is not supported"));
        }
      }
      return absl::OkStatus();
    };
    if (s.contains("$ref")) {
      RETURN_IF_ERROR(only({"$ref"}));
      return Ref(s["$ref"], where, depth);
    }
    if (s.contains("const")) {
      RETURN_IF_ERROR(only({"const", "type", "enum"}));
      return Literals({s["const"]}, s, where);
    }
    if (s.contains("enum")) {
      RETURN_IF_ERROR(only({"enum", "type"}));
      if (!s["enum"].is_array() || s["enum"].empty()) {
        return Refuse(where, "enum must be a non-empty array");
      }
      return Literals(s["enum"], s, where);
    }
    for (const char* combinator : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(combinator)) continue;
      RETURN_IF_ERROR(only({combinator}));
      const json& list = s[combinator];
      if (!list.is_array() || list.empty()) {
        return Refuse(where, absl::StrCat(combinator, " must be a non-empty array"));
      }
      if (std::string(combinator) == "allOf") {
        if (list.size() != 1)
          return Refuse(where, "allOf of more than one schema is not supported");
        return Schema(list[0], absl::StrCat(where, "/allOf/0"), depth + 1);
      }
      std::vector<Sequence> alternatives;
      for (size_t i = 0; i < list.size(); ++i) {
        ASSIGN_OR_RETURN(Symbol alt,
                         Schema(list[i], absl::StrCat(where, "/", combinator, "/", i), depth + 1));
        alternatives.push_back({alt});
      }
      return GrammarBuilder::Ref(b_.Choice(absl::StrCat(where, "/", combinator), alternatives));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& e : t) {
          if (!e.is_string()) return Refuse(where, "type must be a string or a list of strings");
          types.push_back(e.get<std::string>());
        }
      } else {
        return Refuse(where, "type must be a string or a list of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") ||
               s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else {
      return GrammarBuilder::Ref(AnyValueRule());
    }
    std::vector<Sequence> alternatives;
    for (const std::string& type : types) {
      ASSIGN_OR_RETURN(Symbol sym, Typed(s, type, where, depth));
      alternatives.push_back({sym});
    }
    if (alternatives.size() == 1) return alternatives[0][0];
    return GrammarBuilder::Ref(b_.Choice(absl::StrCat(where, "/type"), alternatives));
  }

  // const or enum: the values' compact JSON, each checked against `type` when given.
  absl::StatusOr<Symbol> Literals(const json& values, const json& s, const std::string& where) {
    std::vector<Sequence> alternatives;
    for (const json& v : values) {
      if (s.contains("type") && s["type"].is_string()) {
        const std::string t = s["type"].get<std::string>();
        const bool fits = (t == "string" && v.is_string()) ||
                          (t == "integer" && v.is_number_integer()) ||
                          (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) ||
                          (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
                          (t == "array" && v.is_array());
        if (!fits) continue;  // the value can never validate
      }
      Sequence literal;
      AppendValue(v, &literal);
      alternatives.push_back(std::move(literal));
    }
    if (alternatives.empty()) return Refuse(where, "no enum or const value has the schema's type");
    return GrammarBuilder::Ref(b_.Choice(absl::StrCat(where, "/enum"), alternatives));
  }

  // A JSON value as a literal, with whitespace allowed where JSON allows it.
  void AppendValue(const json& v, Sequence* out) {
    if (v.is_object() || v.is_array()) {
      const bool object = v.is_object();
      out->push_back(GrammarBuilder::Byte(object ? '{' : '['));
      out->push_back(Ws());
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) {
          for (const Symbol& s : Comma()) out->push_back(s);
        }
        first = false;
        if (object) {
          GrammarBuilder::AppendLiteral(json(key).dump(), out);
          out->push_back(Ws());
          out->push_back(GrammarBuilder::Byte(':'));
          out->push_back(Ws());
        }
        AppendValue(item, out);
      }
      out->push_back(Ws());
      out->push_back(GrammarBuilder::Byte(object ? '}' : ']'));
      return;
    }
    GrammarBuilder::AppendLiteral(v.dump(), out);
  }

  absl::StatusOr<Symbol> Ref(const json& ref, const std::string& where, int depth) {
    if (!ref.is_string()) return Refuse(where, "$ref must be a string");
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return GrammarBuilder::Ref(it->second);
    if (r != "#" && !r.starts_with("#/")) {
      return Refuse(where, absl::StrCat("$ref '", r,
                                        "': only references inside the schema (#/...)"
                                        " are supported"));
    }
    json::json_pointer pointer;
    try {
      pointer = json::json_pointer(r.substr(1));
    } catch (const json::exception&) {
      return Refuse(where, absl::StrCat("$ref '", r, "' is not a JSON pointer"));
    }
    if (!root_.contains(pointer)) return Refuse(where, absl::StrCat("$ref '", r, "' not found"));
    const uint32_t rule = b_.NewRule(r);
    refs_.emplace(r, rule);
    ASSIGN_OR_RETURN(Symbol target, Schema(root_.at(pointer), r, depth + 1));
    b_.AddAlternative(rule, {target});
    return GrammarBuilder::Ref(rule);
  }

  absl::StatusOr<Symbol> Typed(const json& s, const std::string& type, const std::string& where,
                               int depth) {
    auto refuse_others = [&](std::initializer_list<const char*> own) -> absl::Status {
      static const char* kTyped[] = {"properties", "required", "additionalProperties",
                                     "items",      "minItems", "maxItems",
                                     "minLength",  "maxLength"};
      for (const char* k : kTyped) {
        if (!s.contains(k)) continue;
        bool mine = false;
        for (const char* o : own) mine = mine || std::string(o) == k;
        // With several types, a keyword of another type applies to that type only.
        if (!mine && !(s.contains("type") && s["type"].is_array())) {
          return Refuse(where, absl::StrCat("keyword '", k, "' does not apply to type ", type));
        }
      }
      return absl::OkStatus();
    };
    if (type == "string") {
      RETURN_IF_ERROR(refuse_others({"minLength", "maxLength"}));
      ASSIGN_OR_RETURN(int64_t min, Count(s, "minLength", where));
      ASSIGN_OR_RETURN(int64_t max, Count(s, "maxLength", where));
      if (max >= 0 && min > max) return Refuse(where, "minLength exceeds maxLength");
      return String(std::max<int64_t>(min, 0), max);
    }
    if (type == "integer") {
      RETURN_IF_ERROR(refuse_others({}));
      return Integer();
    }
    if (type == "number") {
      RETURN_IF_ERROR(refuse_others({}));
      return Number();
    }
    if (type == "boolean") {
      RETURN_IF_ERROR(refuse_others({}));
      return GrammarBuilder::Ref(b_.Choice(
          "boolean", {GrammarBuilder::Literal("true"), GrammarBuilder::Literal("false")}));
    }
    if (type == "null") {
      RETURN_IF_ERROR(refuse_others({}));
      return GrammarBuilder::Ref(b_.LiteralRule("null", "null"));
    }
    if (type == "array") {
      RETURN_IF_ERROR(refuse_others({"items", "minItems", "maxItems"}));
      return Array(s, where, depth);
    }
    if (type == "object") {
      RETURN_IF_ERROR(refuse_others({"properties", "required", "additionalProperties"}));
      return Object(s, where, depth);
    }
    return Refuse(where, absl::StrCat("unknown type '", type, "'"));
  }

  absl::StatusOr<Symbol> Array(const json& s, const std::string& where, int depth) {
    ASSIGN_OR_RETURN(int64_t min, Count(s, "minItems", where));
    ASSIGN_OR_RETURN(int64_t max, Count(s, "maxItems", where));
    min = std::max<int64_t>(min, 0);
    if (max >= 0 && min > max) return Refuse(where, "minItems exceeds maxItems");
    Symbol item = GrammarBuilder::Ref(AnyValueRule());
    if (s.contains("items")) {
      if (s["items"].is_array()) return Refuse(where, "items as a list (tuples) is not supported");
      ASSIGN_OR_RETURN(item, Schema(s["items"], where + "/items", depth + 1));
    }
    ASSIGN_OR_RETURN(uint32_t items, b_.SeparatedRepeat(where + "/items", item, Comma(), min, max));
    const uint32_t r = b_.NewRule(where);
    b_.AddAlternative(r, {GrammarBuilder::Byte('['), Ws(), GrammarBuilder::Ref(items), Ws(),
                          GrammarBuilder::Byte(']')});
    return GrammarBuilder::Ref(r);
  }

  absl::StatusOr<Symbol> Object(const json& s, const std::string& where, int depth) {
    const json empty = json::object();
    const json& properties = s.contains("properties") ? s["properties"] : empty;
    if (!properties.is_object()) return Refuse(where, "properties must be an object");
    absl::flat_hash_set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Refuse(where, "required must be a list of names");
      for (const json& name : s["required"]) {
        if (!name.is_string()) return Refuse(where, "required must be a list of names");
        if (!properties.contains(name.get<std::string>())) {
          return Refuse(where, absl::StrCat("required property '", name.get<std::string>(),
                                            "' is not among the properties"));
        }
        required.insert(name.get<std::string>());
      }
    }
    // Keys not declared: allowed by additionalProperties true or a schema, or by an object schema
    // that declares no properties and does not forbid them.
    std::optional<Symbol> extra;
    if (s.contains("additionalProperties")) {
      const json& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) {
        ASSIGN_OR_RETURN(extra, Schema(ap, where + "/additionalProperties", depth + 1));
      }
    } else if (properties.empty()) {
      extra = GrammarBuilder::Ref(AnyValueRule());
    }
    struct Member {
      Symbol kv;
      bool required;
    };
    std::vector<Member> members;
    for (const auto& [key, schema] : properties.items()) {
      ASSIGN_OR_RETURN(Symbol value,
                       Schema(schema, absl::StrCat(where, "/properties/", key), depth + 1));
      Sequence kv = GrammarBuilder::Literal(json(key).dump());
      kv.push_back(Ws());
      kv.push_back(GrammarBuilder::Byte(':'));
      kv.push_back(Ws());
      kv.push_back(value);
      members.push_back({GrammarBuilder::Ref(b_.Choice(absl::StrCat(where, "/", key), {kv})),
                         required.contains(key)});
    }
    // tail[c]: the members from i on, c = whether one was written before (a comma comes first).
    std::array<uint32_t, 2> tail = {b_.NewRule(where + "/extra0"), b_.NewRule(where + "/extra1")};
    if (extra.has_value()) {
      const uint32_t member = b_.NewRule(where + "/extra-member");
      b_.AddAlternative(member, {*String(0, -1), Ws(), GrammarBuilder::Byte(':'), Ws(), *extra});
      Sequence more = Comma();
      more.push_back(GrammarBuilder::Ref(member));
      const uint32_t rest =
          b_.Star(where + "/extra*", GrammarBuilder::Ref(b_.Choice(where + "/extra-more", {more})));
      b_.AddAlternative(tail[0], {GrammarBuilder::Ref(member), GrammarBuilder::Ref(rest)});
      b_.AddAlternative(tail[0], {});
      b_.AddAlternative(tail[1], {GrammarBuilder::Ref(rest)});
    } else {
      b_.AddAlternative(tail[0], {});
      b_.AddAlternative(tail[1], {});
    }
    for (size_t i = members.size(); i-- > 0;) {
      std::array<uint32_t, 2> here{};
      for (int c = 0; c < 2; ++c) {
        here[c] = b_.NewRule(absl::StrCat(where, "/members", i, ",", c));
        Sequence with = c == 1 ? Comma() : Sequence{};
        with.push_back(members[i].kv);
        with.push_back(GrammarBuilder::Ref(tail[1]));
        b_.AddAlternative(here[c], std::move(with));
        if (!members[i].required) b_.AddAlternative(here[c], {GrammarBuilder::Ref(tail[c])});
      }
      tail = here;
    }
    const uint32_t r = b_.NewRule(where);
    b_.AddAlternative(r, {GrammarBuilder::Byte('{'), Ws(), GrammarBuilder::Ref(tail[0]), Ws(),
                          GrammarBuilder::Byte('}')});
    return GrammarBuilder::Ref(r);
  }

  const json& root_;
  GrammarBuilder b_;
  absl::flat_hash_map<std::string, uint32_t> refs_;
  std::optional<uint32_t> ws_, string_char_, any_string_, digits_, integer_, number_, any_value_,
      any_object_, any_array_;
};

}  // namespace

absl::StatusOr<Grammar> JsonSchemaGrammar(const nlohmann::ordered_json& schema) {
  return Compiler(schema).Compile();
}

absl::StatusOr<Grammar> JsonSchemaGrammarFromText(std::string_view schema_text) {
  if (schema_text.size() > kMaxSchemaBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("schema: ", schema_text.size(), " bytes (at most ", kMaxSchemaBytes, ")"));
  }
  json schema = json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("schema: not valid JSON");
  return JsonSchemaGrammar(schema);
}

Grammar AnyJsonObjectGrammar() {
  static const json kNone = json::object();
  return Compiler(kNone).AnyObject();
}

}  // namespace tandem::structured
