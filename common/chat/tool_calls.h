// Tool calls in generated text: the formats models are trained to emit, parsed into structured
// calls (name and JSON arguments) and the text around them, as vLLM's tool parsers of the same
// names do.
//   hermes       Qwen2.5/Qwen3, Hermes 2/3 and others: <tool_call>{"name": ..., "arguments": {...}}
//                </tool_call>, any number; the content is the text before the first one.
//   llama3_json  Llama 3.1/3.2/3.3: the whole output is one or more JSON objects {"name": ...,
//                "parameters" (or "arguments"): {...}} separated by ';', optionally after
//                <|python_tag|>; the content is then empty.
//   mistral      Mistral Nemo / Small / Devstral: [TOOL_CALLS] then a JSON list of {"name",
//                "arguments"} (v3), or one or more name[CALL_ID]id[ARGS]{...} / name[ARGS]{...}
//                (v7 and later); the content is the text before the first [TOOL_CALLS]. The marker
//                is a special token: the router keeps special tokens in such a chat's text.
// Text that does not parse as the format (a broken JSON body, a missing name) is all content:
// a malformed call is never half-reported.
#ifndef TANDEM_COMMON_CHAT_TOOL_CALLS_H_
#define TANDEM_COMMON_CHAT_TOOL_CALLS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::chat {

// kJsonArray is not a model's format: it is what tool_choice "required" or a named function
// generates under structured output (ForcedToolCallSchema), a JSON array of
// {"name": ..., "arguments": {...}}; the router picks it per request, never by flag.
enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kMistral, kJsonArray };

// "none", "hermes", "llama3_json", "mistral"; InvalidArgument naming the choices otherwise.
absl::StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view name);
const char* ToolCallFormatName(ToolCallFormat format);
// The format a chat template teaches its model, from the template's text: <tool_call> (hermes),
// <|python_tag|> or an ipython role (llama3_json), [TOOL_CALLS] (mistral), else none.
ToolCallFormat DetectToolCallFormat(std::string_view template_source);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object, as Python's json.dumps writes it
};

struct ParsedChatOutput {
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
};

ParsedChatOutput ParseToolCalls(std::string_view text, ToolCallFormat format);

// The JSON Schema of the output a forced tool choice generates (format kJsonArray): an array of
// {"name": <a tool's name>, "arguments": <that tool's parameters>}; with `function_name`, exactly
// one call of that function; otherwise at least one call, at most one unless `parallel`. `tools`
// is OpenAI's list ({"type": "function", "function": {"name", "parameters"}}); a tool without
// parameters takes an empty object. INVALID_ARGUMENT when there are no tools, the named function is
// not among them, or a tool is malformed.
absl::StatusOr<std::string> ForcedToolCallSchema(std::string_view tools_json,
                                                 const std::string& function_name, bool parallel);

// A chat response's content streamed while it is generated, holding back only what may still turn
// into a tool call: with hermes, text from a `<tool_call>` on (and a trailing partial
// `<tool_c...`); with llama3_json, everything once the output starts with `{` or `<|python_tag|>`;
// with json_array, everything.
// What Add returned, followed by Finish's `content_rest`, is the parsed content exactly.
class ToolCallStreamer {
 public:
  explicit ToolCallStreamer(ToolCallFormat format) : format_(format) {}
  // Appends generated text; returns the content the client may have now (possibly empty).
  std::string Add(std::string_view text);
  // The whole output parsed; `content_rest` receives the content not yet returned by Add.
  ParsedChatOutput Finish(std::string* content_rest) const;

 private:
  ToolCallFormat format_;
  std::string text_;
  size_t sent_ = 0;       // bytes of text_ returned as content
  bool holding_ = false;  // a tool call (may have) started: nothing more until Finish
};

}  // namespace tandem::chat

#endif  // TANDEM_COMMON_CHAT_TOOL_CALLS_H_
