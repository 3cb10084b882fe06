// `tandem chat-template`: renders a model's chat template over a conversation and prints the prompt
// exactly (no newline added), as transformers' apply_chat_template(tokenize=False) would.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_FLAG(
    std::string, messages_file, "",
    "chat-template: JSON file with the conversation, an array of {role, content, ...} messages");
ABSL_FLAG(std::string, tools_file, "",
          "chat-template: JSON file with an array of tools (JSON schemas)");
ABSL_FLAG(bool, add_generation_prompt, false,
          "chat-template: end with the header of an assistant turn");
ABSL_FLAG(
    std::string, kwargs, "",
    "chat-template: a JSON object of extra template variables, e.g. {\"enable_thinking\": false}");
ABSL_FLAG(std::string, template_name, "",
          "chat-template: which of the model's named templates (default: tool_use with tools, else "
          "default)");

namespace tandem::cli {
namespace {

absl::StatusOr<nlohmann::ordered_json> ReadJsonFile(const std::string& flag,
                                                    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, " ", path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::ordered_json parsed =
      nlohmann::ordered_json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": not valid JSON"));
  return parsed;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem chat-template: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

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
