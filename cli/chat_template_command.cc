// `tandem chat-template`: renders a model's chat template over a conversation and prints the prompt
// exactly (no newline added), as transformers' apply_chat_template(tokenize=False) would.
#include <cstdio>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/generate_support.h"
#include "common/base/file.h"
#include "common/chat/chat_template.h"
#include "common/rpc/chat_convert.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_FLAG(
    std::string, messages_file, "",
    "chat-template, generate: JSON file with the conversation, an array of {role, content, ...} "
    "messages (OpenAI's shape)");
ABSL_FLAG(
    std::string, tools_file, "",
    "chat-template, generate: JSON file with an array of tools (OpenAI's shape, JSON schemas)");
ABSL_FLAG(bool, add_generation_prompt, false,
          "chat-template: end with the header of an assistant turn (generate always does)");
ABSL_FLAG(std::string, kwargs, "",
          "chat-template, generate: a JSON object of extra template variables, e.g. "
          "{\"enable_thinking\": false}");
ABSL_FLAG(std::string, template_name, "",
          "chat-template, generate: which of the model's named templates (default: tool_use with "
          "tools, else default)");
ABSL_FLAG(
    std::string, tool_call_parser, "auto",
    "generate --messages-file (in-process): how tool calls in the output are parsed: auto (from "
    "the chat template), hermes, llama3_json, mistral or none; through a router, its own flag "
    "decides");

namespace tandem::cli {
namespace {

absl::StatusOr<nlohmann::ordered_json> ReadJsonFile(const std::string& flag,
                                                    const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok())
    return absl::Status(text.status().code(),
                        absl::StrCat("--", flag, " ", text.status().message()));
  nlohmann::ordered_json parsed =
      nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": not valid JSON"));
  return parsed;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem chat-template: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

absl::StatusOr<std::optional<v1::ChatInput>> ChatInputFromFlags() {
  if (absl::GetFlag(FLAGS_messages_file).empty()) return std::nullopt;
  v1::ChatInput input;
  auto messages = ReadJsonFile("messages-file", absl::GetFlag(FLAGS_messages_file));
  if (!messages.ok()) return messages.status();
  if (absl::Status s = rpc::ChatMessagesFromJson(*messages, input.mutable_messages()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--messages-file: ", s.message()));
  }
  if (!absl::GetFlag(FLAGS_tools_file).empty()) {
    auto tools = ReadJsonFile("tools-file", absl::GetFlag(FLAGS_tools_file));
    if (!tools.ok()) return tools.status();
    if (!tools->is_array())
      return absl::InvalidArgumentError("--tools-file must hold a JSON array");
    input.set_tools_json(tools->dump());
  }
  input.set_template_kwargs_json(absl::GetFlag(FLAGS_kwargs));
  input.set_template_name(absl::GetFlag(FLAGS_template_name));
  input.set_add_generation_prompt(true);
  return input;
}

absl::StatusOr<RenderedChat> RenderChatLocally(const std::string& model_dir,
                                               const v1::ChatInput& input,
                                               const Tokenizer& tokenizer) {
  auto chat_template = chat::ChatTemplate::Load(model_dir);
  if (!chat_template.ok()) return chat_template.status();
  auto request = rpc::ChatRenderRequestFromProto(input);
  if (!request.ok()) return request.status();
  auto text = (*chat_template)->Render(*request);
  if (!text.ok()) return text.status();
  RenderedChat out;
  out.prompt_token_ids = tokenizer.Encode(*text, /*add_special_tokens=*/false);
  out.text = *std::move(text);
  const std::string parser = absl::GetFlag(FLAGS_tool_call_parser);
  if (parser == "auto") {
    out.tool_call_format = chat::DetectToolCallFormat((*chat_template)->ToolTemplateSource());
  } else {
    auto format = chat::ParseToolCallFormat(parser);
    if (!format.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("--tool-call-parser: ", format.status().message()));
    out.tool_call_format = *format;
  }
  return out;
}

int ChatTemplateCommand() {
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) return Fail(absl::InvalidArgumentError("--model DIR is required"));
  if (absl::GetFlag(FLAGS_messages_file).empty()) {
    return Fail(absl::InvalidArgumentError("--messages-file F.json is required"));
  }
  auto chat_template = chat::ChatTemplate::Load(model);
  if (!chat_template.ok()) return Fail(chat_template.status());
  chat::ChatRenderRequest request;
  auto messages = ReadJsonFile("messages-file", absl::GetFlag(FLAGS_messages_file));
  if (!messages.ok()) return Fail(messages.status());
  request.messages = std::move(*messages);
  if (!absl::GetFlag(FLAGS_tools_file).empty()) {
    auto tools = ReadJsonFile("tools-file", absl::GetFlag(FLAGS_tools_file));
    if (!tools.ok()) return Fail(tools.status());
    request.tools = std::move(*tools);
  }
  if (!absl::GetFlag(FLAGS_kwargs).empty()) {
    request.kwargs = nlohmann::ordered_json::parse(absl::GetFlag(FLAGS_kwargs), nullptr,
                                                   /*allow_exceptions=*/false);
    if (request.kwargs.is_discarded() || !request.kwargs.is_object()) {
      return Fail(absl::InvalidArgumentError("--kwargs must be a JSON object"));
    }
  }
  request.add_generation_prompt = absl::GetFlag(FLAGS_add_generation_prompt);
  request.template_name = absl::GetFlag(FLAGS_template_name);
  auto prompt = (*chat_template)->Render(request);
  if (!prompt.ok()) return Fail(prompt.status());
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace tandem::cli
