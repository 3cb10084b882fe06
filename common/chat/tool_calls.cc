#include "common/chat/tool_calls.h"

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_value.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {
namespace {

using nlohmann::ordered_json;

std::string PythonJson(const ordered_json& value) {
  return jinja::ToJson(jinja::Value::FromJson(value), jinja::JsonOptions{});
}

// {"name": string, "arguments"/"parameters": object or JSON text of one} → a call.
bool CallFromJson(const ordered_json& object, ParsedToolCall& call) {
  if (!object.is_object() || !object.contains("name") || !object["name"].is_string()) return false;
  call.name = object["name"].get<std::string>();
  const char* key = object.contains("arguments")    ? "arguments"
                    : object.contains("parameters") ? "parameters"
                                                    : nullptr;
  if (key == nullptr) {
    call.arguments = "{}";
    return true;
  }
  ordered_json arguments = object[key];
  if (arguments.is_string()) {
    arguments =
        ordered_json::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (arguments.is_discarded()) return false;
  }
  if (!arguments.is_object()) return false;
  try {
    call.arguments = PythonJson(arguments);
  } catch (const jinja::JinjaError&) {
    return false;  // nested too deep
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() &&
         (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

ParsedChatOutput ParseHermes(std::string_view text) {
  constexpr std::string_view kOpen = "<tool_call>";
  constexpr std::string_view kClose = "</tool_call>";
  ParsedChatOutput out;
  const size_t first = text.find(kOpen);
  if (first == std::string_view::npos) {
    out.content = std::string(text);
    return out;
  }
  size_t pos = first;
  while (pos != std::string_view::npos) {
    const size_t body_start = pos + kOpen.size();
    size_t close = text.find(kClose, body_start);
    // An unterminated last call (generation stopped before its closing tag) still counts when its
    // body is complete JSON.
    const std::string_view body = text.substr(
        body_start, close == std::string_view::npos ? std::string_view::npos : close - body_start);
    ordered_json parsed = ordered_json::parse(Trim(body), nullptr, /*allow_exceptions=*/false);
    ParsedToolCall call;
    if (parsed.is_discarded() || !CallFromJson(parsed, call))
      return ParsedChatOutput{std::string(text), {}};
    out.tool_calls.push_back(std::move(call));
    if (close == std::string_view::npos) break;
    pos = text.find(kOpen, close + kClose.size());
  }
  out.content = std::string(text.substr(0, first));
  return out;
}

// Where the JSON object that `s` starts with ends (one past its closing brace), by bracket depth
// outside strings; npos when it does not close.
size_t ObjectEnd(std::string_view s) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

ParsedChatOutput ParseLlama3Json(std::string_view text) {
  constexpr std::string_view kPythonTag = "<|python_tag|>";
  std::string_view rest = text;
  if (rest.substr(0, kPythonTag.size()) == kPythonTag) rest.remove_prefix(kPythonTag.size());
  rest = Trim(rest);
  if (rest.empty() || rest.front() != '{') return ParsedChatOutput{std::string(text), {}};
  ParsedChatOutput out;
  while (!rest.empty()) {
    const size_t end = ObjectEnd(rest);
    if (end == std::string_view::npos) return ParsedChatOutput{std::string(text), {}};
    ordered_json parsed =
        ordered_json::parse(rest.substr(0, end), nullptr, /*allow_exceptions=*/false);
    ParsedToolCall call;
    if (parsed.is_discarded() || !CallFromJson(parsed, call))
      return ParsedChatOutput{std::string(text), {}};
    out.tool_calls.push_back(std::move(call));
    rest = Trim(rest.substr(end));
    if (!rest.empty()) {
      if (rest.front() != ';') return ParsedChatOutput{std::string(text), {}};
      rest = Trim(rest.substr(1));
    }
  }
  return out;
}

constexpr std::string_view kMistralTag = "[TOOL_CALLS]";

ParsedChatOutput ParseMistral(std::string_view text) {
  const size_t first = text.find(kMistralTag);
  if (first == std::string_view::npos) return ParsedChatOutput{std::string(text), {}};
  ParsedChatOutput out;
  out.content = std::string(text.substr(0, first));
  const std::string_view rest = Trim(text.substr(first + kMistralTag.size()));
  if (!rest.empty() && rest.front() == '[') {  // v3: one JSON list
    ordered_json list = ordered_json::parse(rest, nullptr, /*allow_exceptions=*/false);
    if (list.is_discarded() || !list.is_array() || list.empty())
      return ParsedChatOutput{std::string(text), {}};
    for (const ordered_json& item : list) {
      ParsedToolCall call;
      if (!CallFromJson(item, call)) return ParsedChatOutput{std::string(text), {}};
      out.tool_calls.push_back(std::move(call));
    }
    return out;
  }
  // v7+: name[CALL_ID]id[ARGS]{...}, each after its own [TOOL_CALLS].
  constexpr std::string_view kArgs = "[ARGS]", kCallId = "[CALL_ID]";
  size_t pos = first;
  while (pos != std::string_view::npos) {
    const size_t start = pos + kMistralTag.size();
    const size_t next = text.find(kMistralTag, start);
    const std::string_view segment =
        text.substr(start, next == std::string_view::npos ? std::string_view::npos : next - start);
    const size_t args = segment.find(kArgs);
    if (args == std::string_view::npos) return ParsedChatOutput{std::string(text), {}};
    std::string_view name = segment.substr(0, args);
    if (const size_t id = name.find(kCallId); id != std::string_view::npos)
      name = name.substr(0, id);
    name = Trim(name);
    ordered_json object = {{"name", std::string(name)}};
    ordered_json arguments =
        ordered_json::parse(Trim(segment.substr(args + kArgs.size())), nullptr, false);
    if (name.empty() || arguments.is_discarded()) return ParsedChatOutput{std::string(text), {}};
    object["arguments"] = std::move(arguments);
    ParsedToolCall call;
    if (!CallFromJson(object, call)) return ParsedChatOutput{std::string(text), {}};
    out.tool_calls.push_back(std::move(call));
    pos = next;
  }
  return out;
}

// The whole output is a JSON array of calls (a forced tool choice); anything else is content.
ParsedChatOutput ParseJsonArray(std::string_view text) {
  ParsedChatOutput out;
  const ordered_json calls = ordered_json::parse(Trim(text), nullptr, /*allow_exceptions=*/false);
  if (!calls.is_discarded() && calls.is_array() && !calls.empty()) {
    for (const ordered_json& c : calls) {
      ParsedToolCall call;
      if (!CallFromJson(c, call)) {
        out.tool_calls.clear();
        break;
      }
      out.tool_calls.push_back(std::move(call));
    }
  }
  if (out.tool_calls.empty()) out.content = std::string(text);
  return out;
}

}  // namespace

absl::StatusOr<std::string> ForcedToolCallSchema(std::string_view tools_json,
                                                 const std::string& function_name, bool parallel) {
  const ordered_json tools = ordered_json::parse(tools_json, nullptr, /*allow_exceptions=*/false);
  if (tools.is_discarded() || !tools.is_array() || tools.empty()) {
    return absl::InvalidArgumentError("tool_choice \"required\" or a named function needs tools");
  }
  ordered_json alternatives = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
        !t["function"].contains("name") || !t["function"]["name"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tools[", i, "] must be {\"type\": \"function\", \"function\": {\"name\": ...}}"));
    }
    const ordered_json& f = t["function"];
    const std::string name = f["name"].get<std::string>();
    if (!function_name.empty() && name != function_name) continue;
    ordered_json parameters = f.contains("parameters") && !f["parameters"].is_null()
                                  ? f["parameters"]
                                  : ordered_json{{"type", "object"},
                                                 {"properties", ordered_json::object()},
                                                 {"additionalProperties", false}};
    alternatives.push_back(
        {{"type", "object"},
         {"properties", {{"name", {{"const", name}}}, {"arguments", parameters}}},
         {"required", {"name", "arguments"}},
         {"additionalProperties", false}});
  }
  if (alternatives.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tool_choice names the function \"", function_name, "\", which is not among the tools"));
  }
  ordered_json schema = {{"type", "array"}, {"minItems", 1}};
  if (!function_name.empty() || !parallel) schema["maxItems"] = 1;
  schema["items"] =
      alternatives.size() == 1 ? alternatives[0] : ordered_json{{"anyOf", alternatives}};
  return schema.dump();
}

absl::StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  if (name == "none") return ToolCallFormat::kNone;
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (name == "mistral") return ToolCallFormat::kMistral;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool-call format \"", std::string(name),
                   "\"; choose none, hermes, llama3_json or mistral"));
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kJsonArray: return "json_array";
    case ToolCallFormat::kNone: break;
  }
  return "none";
}

ToolCallFormat DetectToolCallFormat(std::string_view source) {
  if (source.find("<tool_call>") != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find(kMistralTag) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (source.find("<|python_tag|>") != std::string_view::npos ||
      source.find("ipython") != std::string_view::npos) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

ParsedChatOutput ParseToolCalls(std::string_view text, ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return ParseHermes(text);
    case ToolCallFormat::kLlama3Json: return ParseLlama3Json(text);
    case ToolCallFormat::kMistral: return ParseMistral(text);
    case ToolCallFormat::kJsonArray: return ParseJsonArray(text);
    case ToolCallFormat::kNone: break;
  }
  return ParsedChatOutput{std::string(text), {}};
}

std::string ToolCallStreamer::Add(std::string_view text) {
  text_.append(text);
  if (format_ == ToolCallFormat::kJsonArray) return "";  // calls from the first byte
  if (holding_ || format_ == ToolCallFormat::kNone) {
    if (format_ != ToolCallFormat::kNone) return "";
    std::string out = text_.substr(sent_);
    sent_ = text_.size();
    return out;
  }
  size_t safe = text_.size();
  if (format_ == ToolCallFormat::kHermes || format_ == ToolCallFormat::kMistral) {
    const std::string_view kOpen =
        format_ == ToolCallFormat::kHermes ? std::string_view("<tool_call>") : kMistralTag;
    const size_t open = text_.find(kOpen, sent_ > kOpen.size() ? sent_ - kOpen.size() : 0);
    if (open != std::string::npos) {
      holding_ = true;
      safe = open;
    } else {
      // A suffix that may be the start of the tag waits for the next text.
      for (size_t n = std::min(kOpen.size() - 1, text_.size()); n > 0; --n) {
        if (std::string_view(text_).substr(text_.size() - n) == kOpen.substr(0, n)) {
          safe = text_.size() - n;
          break;
        }
      }
    }
  } else {  // llama3_json: the output is calls only when it starts with one
    constexpr std::string_view kPythonTag = "<|python_tag|>";
    const size_t first = text_.find_first_not_of(" \t\r\n");
    if (sent_ == 0) {
      if (first == std::string::npos) return "";  // only whitespace so far: undecided
      const std::string_view rest = std::string_view(text_).substr(first);
      const bool maybe_tag = rest.size() < kPythonTag.size()
                                 ? kPythonTag.substr(0, rest.size()) == rest
                                 : rest.substr(0, kPythonTag.size()) == kPythonTag;
      if (rest.front() == '{' || maybe_tag) {
        if (rest.front() == '{' || rest.size() >= kPythonTag.size()) holding_ = true;
        return "";
      }
    }
  }
  if (safe <= sent_) return "";
  std::string out = text_.substr(sent_, safe - sent_);
  sent_ = safe;
  return out;
}

ParsedChatOutput ToolCallStreamer::Finish(std::string* content_rest) const {
  ParsedChatOutput parsed = ParseToolCalls(text_, format_);
  // The streamed content is always a prefix of the parsed content (text before the first call, or
  // all of the text when nothing parsed as a call).
  content_rest->assign(parsed.content.size() > sent_ ? parsed.content.substr(sent_) : "");
  return parsed;
}

}  // namespace tandem::chat
