// Chat templates: a model's tokenizer_config.json `chat_template` (one string, or a list of named
// templates) or the chat_template.jinja file beside it, rendered the way Hugging Face transformers
// renders them (jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and
// loopcontrols, transformers' own tojson, raise_exception and strftime_now) by Tandem's own Jinja
// engine (jinja.h). Byte-for-byte equality with Python's jinja2 is what tests/conformance checks.
//
// Thread-safety: a ChatTemplate is immutable after Create/Load; Render may run on many threads.
#ifndef TANDEM_COMMON_CHAT_CHAT_TEMPLATE_H_
#define TANDEM_COMMON_CHAT_CHAT_TEMPLATE_H_

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {

class JinjaTemplate;

// What one rendering takes. JSON values are passed to the template as given (objects keep their key
// order), as transformers passes the caller's Python objects.
struct ChatRenderRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{role, content, ...}]
  nlohmann::ordered_json tools;      // null: no tools (the template sees `tools` as none)
  nlohmann::ordered_json documents;  // null: none
  bool add_generation_prompt = false;
  // Extra template variables (e.g. {"enable_thinking": false}); they override the special tokens.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  // Which named template; empty chooses as transformers does: "tool_use" when tools are given and
  // the model has one, else "default".
  std::string template_name;
};

class ChatTemplate {
 public:
  // Reads `model_dir`/tokenizer_config.json (required) and `model_dir`/chat_template.jinja (which
  // wins over the config's `chat_template`, as in transformers). NotFound when the model has no
  // template; InvalidArgument, naming the template, when one cannot be parsed or uses something the
  // engine does not implement (refused here rather than mis-rendered later).
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Load(const std::filesystem::path& model_dir);

  // The same from a parsed tokenizer_config.json and the text of a chat_template.jinja (nullopt
  // when there is none).
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromConfig(
      const nlohmann::ordered_json& tokenizer_config, std::optional<std::string> jinja_file);

  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // The rendered prompt. InvalidArgument for a request the template rejects (raise_exception's
  // message is kept), for an unknown template_name, or for a render error (an undefined attribute
  // of an undefined value, a type error), with jinja2's wording where it has one.
  absl::StatusOr<std::string> Render(const ChatRenderRequest& request) const;

  // Names of the templates the model has ("default" for a single string).
  std::vector<std::string> TemplateNames() const;
  // The source of the template rendered for tools (tool_use when the model has one, else default;
  // empty when neither exists): what DetectToolCallFormat reads.
  const std::string& ToolTemplateSource() const;

  // The special tokens passed to every rendering, as transformers 4.x's special_tokens_map has
  // them: bos/eos/unk/sep/pad/cls/mask_token (non-empty), additional_special_tokens (a list), and
  // the entries of an extra_special_tokens object (transformers >= 4.47).
  const nlohmann::ordered_json& SpecialTokens() const { return special_tokens_; }

 private:
  ChatTemplate() = default;

  std::map<std::string, std::unique_ptr<JinjaTemplate>> templates_;
  std::map<std::string, std::string> sources_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace tandem::chat

#endif  // TANDEM_COMMON_CHAT_CHAT_TEMPLATE_H_
