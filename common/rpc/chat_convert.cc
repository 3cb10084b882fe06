#include "common/rpc/chat_convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"

namespace tandem::rpc {
namespace {

using nlohmann::ordered_json;

absl::StatusOr<ordered_json> ParseJson(const std::string& text, const std::string& field,
                                       bool want_object) {
  ordered_json parsed = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(field, " is not valid JSON"));
  if (want_object ? !parsed.is_object() : !parsed.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be a JSON ", want_object ? "object" : "array"));
  }
  return parsed;
}

absl::StatusOr<ordered_json> MessageToJson(const v1::ChatMessage& m, const std::string& where) {
  ordered_json out = ordered_json::object();
  out["role"] = m.role();
  switch (m.body_case()) {
    case v1::ChatMessage::kContent: out["content"] = m.content(); break;
    case v1::ChatMessage::kParts: {
      ordered_json parts = ordered_json::array();
      for (const v1::ContentPart& part : m.parts().parts())
        parts.push_back({{"type", part.type()}, {"text", part.text()}});
      out["content"] = std::move(parts);
      break;
    }
    default: out["content"] = nullptr;
  }
  if (m.tool_calls_size() > 0) {
    ordered_json calls = ordered_json::array();
    for (int i = 0; i < m.tool_calls_size(); ++i) {
      const v1::ToolCall& call = m.tool_calls(i);
      const std::string field = absl::StrCat(where, ".tool_calls[", i, "].arguments");
      ordered_json arguments = ordered_json::object();
      if (!call.arguments().empty()) {
        ASSIGN_OR_RETURN(arguments, ParseJson(call.arguments(), field, /*want_object=*/true));
      }
      ordered_json entry = ordered_json::object();
      if (!call.id().empty()) entry["id"] = call.id();
      entry["type"] = call.type().empty() ? "function" : call.type();
      entry["function"] = {{"name", call.name()}, {"arguments", std::move(arguments)}};
      calls.push_back(std::move(entry));
    }
    out["tool_calls"] = std::move(calls);
  }
  if (!m.tool_call_id().empty()) out["tool_call_id"] = m.tool_call_id();
  if (!m.name().empty()) out["name"] = m.name();
  if (!m.reasoning_content().empty()) out["reasoning_content"] = m.reasoning_content();
  if (!m.extra_json().empty()) {
    ASSIGN_OR_RETURN(ordered_json extra,
                     ParseJson(m.extra_json(), where + ".extra_json", /*want_object=*/true));
    for (auto& [key, value] : extra.items()) {
      if (out.contains(key)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".extra_json sets \"", key, "\", which the message has"));
      }
      out[key] = std::move(value);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<chat::ChatRenderRequest> ChatRenderRequestFromProto(const v1::ChatInput& input) {
  chat::ChatRenderRequest request;
  if (input.messages_size() == 0) return absl::InvalidArgumentError("chat.messages is empty");
  for (int i = 0; i < input.messages_size(); ++i) {
    ASSIGN_OR_RETURN(ordered_json message,
                     MessageToJson(input.messages(i), absl::StrCat("chat.messages[", i, "]")));
    request.messages.push_back(std::move(message));
  }
  if (!input.tools_json().empty()) {
    ASSIGN_OR_RETURN(request.tools,
                     ParseJson(input.tools_json(), "chat.tools_json", /*want_object=*/false));
  }
  if (!input.template_kwargs_json().empty()) {
    ASSIGN_OR_RETURN(request.kwargs, ParseJson(input.template_kwargs_json(),
                                               "chat.template_kwargs_json", /*want_object=*/true));
  }
  request.add_generation_prompt =
      !input.has_add_generation_prompt() || input.add_generation_prompt();
  request.template_name = input.template_name();
  return request;
}

absl::Status ChatMessagesFromJson(const ordered_json& messages,
                                  google::protobuf::RepeatedPtrField<v1::ChatMessage>* out) {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a JSON array");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& m = messages[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object())
      return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
    v1::ChatMessage* message = out->Add();
    ordered_json extra = ordered_json::object();
    auto string_field = [&](const std::string& key, std::string* target) -> absl::Status {
      if (!m[key].is_string())
        return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " must be a string"));
      *target = m[key].get<std::string>();
      return absl::OkStatus();
    };
    for (const auto& [key, value] : m.items()) {
      if (key == "role") {
        RETURN_IF_ERROR(string_field(key, message->mutable_role()));
      } else if (key == "content") {
        if (value.is_string()) {
          message->set_content(value.get<std::string>());
        } else if (value.is_array()) {
          auto* parts = message->mutable_parts();
          for (size_t j = 0; j < value.size(); ++j) {
            const ordered_json& part = value[j];
            if (!part.is_object() || !part.contains("type") || !part["type"].is_string() ||
                (part.contains("text") && !part["text"].is_string())) {
              return absl::InvalidArgumentError(absl::StrCat(
                  where, ".content[", j, "] must be an object with a string type (and text)"));
            }
            v1::ContentPart* p = parts->add_parts();
            p->set_type(part["type"].get<std::string>());
            if (part.contains("text")) p->set_text(part["text"].get<std::string>());
          }
        } else if (!value.is_null()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ".content must be a string, a list of parts or null"));
        }
      } else if (key == "tool_calls") {
        if (!value.is_array())
          return absl::InvalidArgumentError(absl::StrCat(where, ".tool_calls must be a list"));
        for (size_t j = 0; j < value.size(); ++j) {
          const ordered_json& call = value[j];
          const std::string cw = absl::StrCat(where, ".tool_calls[", j, "]");
          if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
              !call["function"].contains("name") || !call["function"]["name"].is_string()) {
            return absl::InvalidArgumentError(
                absl::StrCat(cw, " must be {\"function\": {\"name\": ..., \"arguments\": ...}}"));
          }
          v1::ToolCall* c = message->add_tool_calls();
          if (call.contains("id")) {
            if (!call["id"].is_string())
              return absl::InvalidArgumentError(absl::StrCat(cw, ".id must be a string"));
            c->set_id(call["id"].get<std::string>());
          }
          if (call.contains("type")) {
            if (!call["type"].is_string())
              return absl::InvalidArgumentError(absl::StrCat(cw, ".type must be a string"));
            c->set_type(call["type"].get<std::string>());
          }
          c->set_name(call["function"]["name"].get<std::string>());
          if (call["function"].contains("arguments")) {
            const ordered_json& arguments = call["function"]["arguments"];
            if (arguments.is_string()) {
              c->set_arguments(arguments.get<std::string>());
            } else if (arguments.is_object()) {
              c->set_arguments(arguments.dump());
            } else {
              return absl::InvalidArgumentError(
                  absl::StrCat(cw, ".function.arguments must be a JSON object or its text"));
            }
          }
        }
      } else if (key == "tool_call_id") {
        RETURN_IF_ERROR(string_field(key, message->mutable_tool_call_id()));
      } else if (key == "name") {
        RETURN_IF_ERROR(string_field(key, message->mutable_name()));
      } else if (key == "reasoning_content") {
        if (!value.is_null())
          RETURN_IF_ERROR(string_field(key, message->mutable_reasoning_content()));
      } else {
        extra[key] = value;
      }
    }
    if (message->role().empty())
      return absl::InvalidArgumentError(absl::StrCat(where, ".role is missing"));
    if (!extra.empty()) message->set_extra_json(extra.dump());
  }
  return absl::OkStatus();
}

v1::ChatOutput ChatOutputFromText(const std::string& text, chat::ToolCallFormat format,
                                  const std::string& request_id) {
  chat::ParsedChatOutput parsed = chat::ParseToolCalls(text, format);
  v1::ChatOutput out;
  out.set_content(std::move(parsed.content));
  const uint64_t salt = std::hash<std::string>{}(request_id);
  for (size_t i = 0; i < parsed.tool_calls.size(); ++i) {
    v1::ToolCall* call = out.add_tool_calls();
    call->set_id(absl::StrFormat("call_%016x%02d", salt, i));
    call->set_type("function");
    call->set_name(std::move(parsed.tool_calls[i].name));
    call->set_arguments(std::move(parsed.tool_calls[i].arguments));
  }
  return out;
}

ordered_json ChatOutputToJson(const v1::ChatOutput& output) {
  ordered_json calls = ordered_json::array();
  for (const v1::ToolCall& call : output.tool_calls()) {
    calls.push_back({{"id", call.id()},
                     {"type", call.type()},
                     {"function", {{"name", call.name()}, {"arguments", call.arguments()}}}});
  }
  return {{"content", output.content()}, {"tool_calls", std::move(calls)}};
}

}  // namespace tandem::rpc
