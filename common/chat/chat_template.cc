#include "common/chat/chat_template.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file.h"
#include "common/chat/jinja.h"

namespace tandem::chat {
namespace {

// transformers' special_tokens_map order; AddedToken objects become their content.
constexpr const char* kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                             "pad_token", "cls_token", "mask_token"};

std::optional<std::string> TokenText(const nlohmann::ordered_json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Load(
    const std::filesystem::path& model_dir) {
  const std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  auto config_text = ReadFileToString(config_path.string());
  if (!config_text.ok()) return config_text.status();
  nlohmann::ordered_json config =
      nlohmann::ordered_json::parse(*config_text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path.string(), " is not a JSON object"));
  }
  std::optional<std::string> jinja_file;
  const std::filesystem::path jinja_path = model_dir / "chat_template.jinja";
  std::error_code ec;
  if (std::filesystem::exists(jinja_path, ec)) {
    auto text = ReadFileToString(jinja_path.string());
    if (!text.ok()) return text.status();
    jinja_file = std::move(*text);
  }
  return FromConfig(config, std::move(jinja_file));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromConfig(
    const nlohmann::ordered_json& config, std::optional<std::string> jinja_file) {
  if (!config.is_object())
    return absl::InvalidArgumentError("tokenizer_config.json must be a JSON object");
  std::unique_ptr<ChatTemplate> result(new ChatTemplate());
  std::vector<std::pair<std::string, std::string>> sources;
  if (jinja_file.has_value()) {
    sources.emplace_back("default", std::move(*jinja_file));
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const auto& value = config["chat_template"];
    if (value.is_string()) {
      sources.emplace_back("default", value.get<std::string>());
    } else if (value.is_array()) {
      for (const auto& entry : value) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string()) {
          return absl::InvalidArgumentError(
              "chat_template: a list entry must be an object with string fields \"name\" and "
              "\"template\"");
        }
        sources.emplace_back(entry["name"].get<std::string>(),
                             entry["template"].get<std::string>());
      }
    } else {
      return absl::InvalidArgumentError(
          "chat_template must be a string or a list of {name, template}");
    }
  }
  if (sources.empty()) {
    return absl::NotFoundError(
        "the model has no chat template (no chat_template in tokenizer_config.json, "
        "no chat_template.jinja)");
  }
  for (auto& [name, source] : sources) {
    auto compiled = JinjaTemplate::Create(source);
    if (!compiled.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template '", name, "' cannot be used: ", compiled.status().message()));
    }
    result->templates_[name] = std::move(*compiled);
    result->sources_[name] = std::move(source);
  }
  for (const char* key : kSpecialTokenKeys) {
    if (!config.contains(key)) continue;
    auto text = TokenText(config[key]);
    if (text && !text->empty()) result->special_tokens_[key] = *text;
  }
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array() &&
      !config["additional_special_tokens"].empty()) {
    nlohmann::ordered_json extra = nlohmann::ordered_json::array();
    for (const auto& token : config["additional_special_tokens"]) {
      if (auto text = TokenText(token)) extra.push_back(*text);
    }
    result->special_tokens_["additional_special_tokens"] = std::move(extra);
  }
  // Model-specific named tokens (Gemma 3's image tokens): transformers >= 4.47 adds them to the
  // map.
  if (config.contains("extra_special_tokens") && config["extra_special_tokens"].is_object()) {
    for (const auto& [key, value] : config["extra_special_tokens"].items()) {
      auto text = TokenText(value);
      if (text && !text->empty()) result->special_tokens_[key] = *text;
    }
  }
  return result;
}

std::vector<std::string> ChatTemplate::TemplateNames() const {
  std::vector<std::string> names;
  for (const auto& [name, t] : templates_) names.push_back(name);
  return names;
}

const std::string& ChatTemplate::ToolTemplateSource() const {
  static const std::string kNone;
  auto it = sources_.find("tool_use");
  if (it == sources_.end()) it = sources_.find("default");
  return it == sources_.end() ? kNone : it->second;
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatRenderRequest& request) const {
  std::string name = request.template_name;
  if (name.empty()) {
    if (!request.tools.is_null() && templates_.count("tool_use") != 0) {
      name = "tool_use";
    } else if (templates_.count("default") != 0) {
      name = "default";
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("the model has several chat templates and none named default: ",
                       absl::StrJoin(TemplateNames(), ", ")));
    }
  }
  auto it = templates_.find(name);
  if (it == templates_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no chat template named '", name,
                     "'; the model has: ", absl::StrJoin(TemplateNames(), ", ")));
  }
  if (!request.messages.is_array())
    return absl::InvalidArgumentError("messages must be a JSON array");
  if (!request.tools.is_null() && !request.tools.is_array()) {
    return absl::InvalidArgumentError("tools must be a JSON array");
  }
  if (!request.kwargs.is_object())
    return absl::InvalidArgumentError("template kwargs must be a JSON object");
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  variables["messages"] = request.messages;
  variables["tools"] = request.tools;
  variables["documents"] = request.documents;
  variables["add_generation_prompt"] = request.add_generation_prompt;
  for (const auto& [key, value] : special_tokens_.items()) variables[key] = value;
  for (const auto& [key, value] : request.kwargs.items()) {
    if (key == "messages" || key == "tools" || key == "documents" ||
        key == "add_generation_prompt") {
      return absl::InvalidArgumentError(absl::StrCat("template kwargs cannot set '", key, "'"));
    }
    variables[key] = value;
  }
  return it->second->Render(variables);
}

}  // namespace tandem::chat
