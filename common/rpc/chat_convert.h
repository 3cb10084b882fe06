// Chat requests between their three shapes: the proto ChatInput of the public API, OpenAI-style
// JSON messages (what `tandem generate --messages-file` reads and the HTTP API receives), and the
// ChatRenderRequest the chat template renders. Messages reach the template as transformers (and
// vLLM) hand them over: role and content first, tool_calls with their arguments parsed into an
// object, then the other fields.
#pragma once

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "common/chat/tool_calls.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generation.pb.h"

namespace tandem::rpc {

// InvalidArgument naming the field for what cannot be rendered: tools_json or template_kwargs_json
// that is not a JSON array / object, tool-call arguments that are not a JSON object, extra_json
// that is not an object or sets a field the message already has.
absl::StatusOr<chat::ChatRenderRequest> ChatRenderRequestFromProto(const v1::ChatInput& input);

// OpenAI-style messages ([{role, content: string|null|[{type, text}], tool_calls: [{id, type,
// function: {name, arguments: string|object}}], tool_call_id, name, reasoning_content, ...}]) into
// proto messages; fields the proto does not name travel in extra_json. InvalidArgument naming the
// message and field for a wrong type.
absl::Status ChatMessagesFromJson(const nlohmann::ordered_json& messages,
                                  google::protobuf::RepeatedPtrField<v1::ChatMessage>* out);

// A chat response's structured output: `text` parsed for tool calls in `format`; each call gets an
// id ("call_" and hex digits) derived from `request_id` and its index.
v1::ChatOutput ChatOutputFromText(const std::string& text, chat::ToolCallFormat format,
                                  const std::string& request_id);
// {"content": ..., "tool_calls": [{"id", "type", "function": {"name", "arguments"}}]}, OpenAI's
// shape.
nlohmann::ordered_json ChatOutputToJson(const v1::ChatOutput& output);

}  // namespace tandem::rpc
