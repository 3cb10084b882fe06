#include "router/openai_api.h"

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/rpc/chat_convert.h"

namespace tandem::router::openai {
namespace {

absl::Status Bad(const std::string& message) { return absl::InvalidArgumentError(message); }

// Typed access to the body's fields, naming the field in every error.
class Fields {
 public:
  explicit Fields(const Json& body) : body_(body) {}
  bool Has(const char* key) const { return body_.contains(key) && !body_[key].is_null(); }
  const Json& Get(const char* key) const { return body_[key]; }

  absl::StatusOr<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!Get(key).is_boolean()) return Bad(absl::StrCat("'", key, "' must be a boolean"));
    return Get(key).get<bool>();
  }
  absl::StatusOr<int64_t> Int(const char* key, int64_t lo, int64_t hi) const {
    const Json& v = Get(key);
    if (!v.is_number_integer() &&
        !(v.is_number_float() &&
          v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())))) {
      return Bad(absl::StrCat("'", key, "' must be an integer"));
    }
    const int64_t i =
        v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
    if (i < lo || i > hi)
      return Bad(absl::StrCat("'", key, "' must be in [", lo, ", ", hi, "], got ", i));
    return i;
  }
  absl::StatusOr<double> Number(const char* key) const {
    if (!Get(key).is_number()) return Bad(absl::StrCat("'", key, "' must be a number"));
    return Get(key).get<double>();
  }

 private:
  const Json& body_;
};

const std::set<std::string>& CommonKeys() {
  static const std::set<std::string> keys = {
      "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
      "seed", "presence_penalty", "frequency_penalty", "logit_bias", "user",
      // vLLM-style extras
      "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "skip_special_tokens",
      "response_format", "guided_json"};
  return keys;
}

const std::set<std::string>& EndpointKeys(Endpoint endpoint) {
  static const std::set<std::string> completions = {"prompt", "echo", "logprobs", "suffix",
                                                    "best_of"};
  static const std::set<std::string> chat = {"messages",
                                             "max_completion_tokens",
                                             "logprobs",
                                             "top_logprobs",
                                             "tools",
                                             "tool_choice",
                                             "parallel_tool_calls",
                                             "chat_template_kwargs",
                                             "add_generation_prompt"};
  return endpoint == Endpoint::kCompletions ? completions : chat;
}

absl::Status ParseSampling(const Fields& f, Endpoint endpoint, int32_t max_logprobs,
                           v1::SamplingParameters* s, ParsedRequest* out) {
  auto number = [&](const char* key, auto setter) -> absl::Status {
    if (!f.Has(key)) return absl::OkStatus();
    ASSIGN_OR_RETURN(double v, f.Number(key));
    setter(static_cast<float>(v));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(number("temperature", [&](float v) { s->set_temperature(v); }));
  RETURN_IF_ERROR(number("top_p", [&](float v) { s->set_top_p(v); }));
  RETURN_IF_ERROR(number("min_p", [&](float v) { s->set_min_p(v); }));
  RETURN_IF_ERROR(number("presence_penalty", [&](float v) { s->set_presence_penalty(v); }));
  RETURN_IF_ERROR(number("frequency_penalty", [&](float v) { s->set_frequency_penalty(v); }));
  RETURN_IF_ERROR(number("repetition_penalty", [&](float v) { s->set_repetition_penalty(v); }));
  if (f.Has("top_k")) {
    ASSIGN_OR_RETURN(int64_t k, f.Int("top_k", -1, INT32_MAX));
    s->set_top_k(static_cast<int32_t>(k));
  }
  // max_completion_tokens is chat's current name; max_tokens its deprecated one.
  const char* max_key = endpoint == Endpoint::kChatCompletions && f.Has("max_completion_tokens")
                            ? "max_completion_tokens"
                            : "max_tokens";
  if (f.Has(max_key)) {
    ASSIGN_OR_RETURN(int64_t m, f.Int(max_key, 0, INT32_MAX));
    s->set_max_tokens(static_cast<int32_t>(m));
  }
  if (f.Has("min_tokens")) {
    ASSIGN_OR_RETURN(int64_t m, f.Int("min_tokens", 0, INT32_MAX));
    s->set_min_tokens(static_cast<int32_t>(m));
  }
  if (f.Has("seed")) {
    ASSIGN_OR_RETURN(int64_t seed, f.Int("seed", 0, INT64_MAX));
    s->set_seed(static_cast<uint64_t>(seed));
  }
  ASSIGN_OR_RETURN(bool ignore_eos, f.Bool("ignore_eos", false));
  s->set_ignore_eos(ignore_eos);
  ASSIGN_OR_RETURN(bool skip_special, f.Bool("skip_special_tokens", true));
  s->set_skip_special_tokens(skip_special);
  if (f.Has("stop")) {
    const Json& stop = f.Get("stop");
    if (stop.is_string()) {
      s->add_stop(stop.get<std::string>());
    } else if (stop.is_array()) {
      for (const Json& item : stop) {
        if (!item.is_string()) return Bad("'stop' must be a string or a list of strings");
        s->add_stop(item.get<std::string>());
      }
    } else {
      return Bad("'stop' must be a string or a list of strings");
    }
  }
  if (f.Has("logit_bias")) {
    const Json& bias = f.Get("logit_bias");
    if (!bias.is_object()) return Bad("'logit_bias' must be an object of token id -> bias");
    for (const auto& [key, value] : bias.items()) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(key, &id))
        return Bad(absl::StrCat("'logit_bias' key \"", key, "\" is not a token id"));
      if (!value.is_number() || value.get<double>() < -100 || value.get<double>() > 100) {
        return Bad(
            absl::StrCat("'logit_bias' value for ", key, " must be a number in [-100, 100]"));
      }
      v1::LogitBiasEntry* e = s->add_logit_bias();
      e->set_token_id(id);
      e->set_bias(static_cast<float>(value.get<double>()));
    }
  }
  if (endpoint == Endpoint::kCompletions) {
    if (f.Has("logprobs")) {
      ASSIGN_OR_RETURN(int64_t k, f.Int("logprobs", 0, max_logprobs));
      out->logprobs = static_cast<int32_t>(k);
    }
  } else {
    ASSIGN_OR_RETURN(bool want, f.Bool("logprobs", false));
    if (f.Has("top_logprobs")) {
      ASSIGN_OR_RETURN(int64_t k, f.Int("top_logprobs", 0, max_logprobs));
      if (!want) return Bad("'top_logprobs' needs 'logprobs': true");
      out->logprobs = static_cast<int32_t>(k);
    } else if (want) {
      out->logprobs = 0;
    }
  }
  if (out->logprobs >= 0) s->set_logprobs(out->logprobs);
  return absl::OkStatus();
}

// response_format (OpenAI) and guided_json (vLLM's extra field) → structured output.
absl::Status ParseStructuredOutput(const Fields& f, v1::SamplingParameters* s) {
  v1::StructuredOutput* so = s->mutable_structured_output();
  if (f.Has("response_format")) {
    const Json& format = f.Get("response_format");
    if (!format.is_object() || !format.contains("type") || !format["type"].is_string()) {
      return Bad(
          "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
    }
    const std::string type = format["type"].get<std::string>();
    if (type == "json_object") {
      so->set_json_object(true);
    } else if (type == "json_schema") {
      if (!format.contains("json_schema") || !format["json_schema"].is_object() ||
          !format["json_schema"].contains("schema") ||
          !(format["json_schema"]["schema"].is_object() ||
            format["json_schema"]["schema"].is_boolean())) {
        return Bad(
            "'response_format' json_schema needs \"json_schema\": {\"name\": ..., \"schema\": "
            "{...}}");
      }
      so->set_json_schema(format["json_schema"]["schema"].dump());
    } else if (type != "text") {
      return Bad(absl::StrCat("'response_format' type \"", type,
                              "\" is not one of text, json_object, json_schema"));
    }
  }
  if (f.Has("guided_json")) {
    if (so->kind_case() != v1::StructuredOutput::KIND_NOT_SET) {
      return Bad("'guided_json' and 'response_format': give one");
    }
    const Json& g = f.Get("guided_json");
    if (g.is_string()) {
      so->set_json_schema(g.get<std::string>());
    } else if (g.is_object() || g.is_boolean()) {
      so->set_json_schema(g.dump());
    } else {
      return Bad("'guided_json' must be a JSON schema (an object, or its text)");
    }
  }
  if (so->kind_case() == v1::StructuredOutput::KIND_NOT_SET) s->clear_structured_output();
  return absl::OkStatus();
}

absl::Status ParseTools(const Fields& f, v1::ChatInput* chat, ParsedRequest* out) {
  bool tools_given = false;
  if (f.Has("tools")) {
    const Json& tools = f.Get("tools");
    if (!tools.is_array()) return Bad("'tools' must be a list");
    for (size_t i = 0; i < tools.size(); ++i) {
      const Json& t = tools[i];
      if (!t.is_object() || !t.contains("type") || t["type"] != "function" ||
          !t.contains("function") || !t["function"].is_object() ||
          !t["function"].contains("name") || !t["function"]["name"].is_string()) {
        return Bad(absl::StrCat(
            "'tools[", i, "]' must be {\"type\": \"function\", \"function\": {\"name\": ...}}"));
      }
    }
    tools_given = !tools.empty();
    if (tools_given) chat->set_tools_json(tools.dump());
  }
  std::string choice = "auto";
  if (f.Has("tool_choice")) {
    const Json& c = f.Get("tool_choice");
    if (c.is_string()) {
      choice = c.get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required") {
        return Bad("'tool_choice' must be \"none\", \"auto\", \"required\" or a named function");
      }
    } else if (c.is_object()) {
      choice = "named";
    } else {
      return Bad("'tool_choice' must be \"none\", \"auto\", \"required\" or a named function");
    }
  }
  v1::ToolChoice* tc = chat->mutable_tool_choice();
  if (choice == "none") {
    tc->set_mode(v1::ToolChoice::MODE_NONE);
  } else if (choice == "required" || choice == "named") {
    if (!tools_given) return Bad("'tool_choice' \"required\" or a named function needs 'tools'");
    tc->set_mode(choice == "required" ? v1::ToolChoice::MODE_REQUIRED
                                      : v1::ToolChoice::MODE_FUNCTION);
    if (choice == "named") {
      const Json& c = f.Get("tool_choice");
      if (!c.contains("type") || c["type"] != "function" || !c.contains("function") ||
          !c["function"].is_object() || !c["function"].contains("name") ||
          !c["function"]["name"].is_string()) {
        return Bad(
            "a named 'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": "
            "...}}");
      }
      tc->set_function_name(c["function"]["name"].get<std::string>());
    }
    out->forced_tool_calls = true;
  }
  if (f.Has("parallel_tool_calls")) {
    if (!f.Get("parallel_tool_calls").is_boolean()) {
      return Bad("'parallel_tool_calls' must be a boolean");
    }
    tc->set_parallel_tool_calls(f.Get("parallel_tool_calls").get<bool>());
  }
  out->parse_tool_calls = tools_given && choice != "none";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, const std::string& text,
                                           const std::string& served_model, int32_t max_logprobs) {
  const Json body = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return Bad("the request body is not valid JSON");
  if (!body.is_object()) return Bad("the request body must be a JSON object");
  for (const auto& [key, value] : body.items()) {
    if (CommonKeys().count(key) == 0 && EndpointKeys(endpoint).count(key) == 0) {
      return Bad(absl::StrCat("unrecognized request argument supplied: ", key));
    }
  }
  const Fields f(body);
  ParsedRequest out;
  out.endpoint = endpoint;
  out.model = served_model;
  if (f.Has("model")) {
    if (!f.Get("model").is_string()) return Bad("'model' must be a string");
    const std::string model = f.Get("model").get<std::string>();
    if (model != served_model) {
      return absl::NotFoundError(absl::StrCat(
          "The model `", model, "` does not exist; this server serves `", served_model, "`"));
    }
  }
  ASSIGN_OR_RETURN(out.stream, f.Bool("stream", false));
  if (f.Has("stream_options")) {
    const Json& options = f.Get("stream_options");
    if (!options.is_object()) return Bad("'stream_options' must be an object");
    if (!out.stream) return Bad("'stream_options' is only allowed with 'stream': true");
    for (const auto& [key, value] : options.items()) {
      if (key != "include_usage" && key != "continuous_usage_stats") {
        return Bad(absl::StrCat("unrecognized stream option: ", key));
      }
    }
    if (options.contains("include_usage")) {
      if (!options["include_usage"].is_boolean())
        return Bad("'stream_options.include_usage' must be a boolean");
      out.include_usage = options["include_usage"].get<bool>();
    }
  }
  if (f.Has("n")) {
    ASSIGN_OR_RETURN(int64_t n, f.Int("n", 1, 128));
    out.n = static_cast<int>(n);
  }
  if (f.Has("user") && !f.Get("user").is_string()) return Bad("'user' must be a string");

  v1::GenerateRequest base;
  RETURN_IF_ERROR(ParseSampling(f, endpoint, max_logprobs, base.mutable_sampling(), &out));
  RETURN_IF_ERROR(ParseStructuredOutput(f, base.mutable_sampling()));

  std::vector<v1::GenerateRequest> prompts;
  std::vector<std::string> prompt_texts;
  if (endpoint == Endpoint::kCompletions) {
    if (f.Has("suffix") &&
        !(f.Get("suffix").is_string() && f.Get("suffix").get<std::string>().empty())) {
      return Bad("'suffix' is not supported");
    }
    if (f.Has("best_of")) {
      ASSIGN_OR_RETURN(int64_t best_of, f.Int("best_of", 1, 128));
      if (best_of != out.n) return Bad("'best_of' other than 'n' is not supported");
    }
    ASSIGN_OR_RETURN(out.echo, f.Bool("echo", false));
    if (!f.Has("prompt")) return Bad("'prompt' is required");
    const Json& prompt = f.Get("prompt");
    auto add_ids = [&](const Json& ids) -> absl::Status {
      v1::GenerateRequest r = base;
      for (const Json& id : ids) {
        if (!id.is_number_integer()) return Bad("'prompt' token ids must be integers");
        r.mutable_prompt_token_ids()->add_ids(id.get<int32_t>());
      }
      if (ids.empty()) return Bad("'prompt' is empty");
      prompts.push_back(std::move(r));
      prompt_texts.emplace_back();
      return absl::OkStatus();
    };
    auto add_text = [&](const Json& t) {
      v1::GenerateRequest r = base;
      r.set_prompt(t.get<std::string>());
      r.set_add_special_tokens(true);
      prompts.push_back(std::move(r));
      prompt_texts.push_back(t.get<std::string>());
    };
    if (prompt.is_string()) {
      add_text(prompt);
    } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
      RETURN_IF_ERROR(add_ids(prompt));
    } else if (prompt.is_array() && !prompt.empty()) {
      for (const Json& item : prompt) {
        if (item.is_string()) {
          add_text(item);
        } else if (item.is_array()) {
          RETURN_IF_ERROR(add_ids(item));
        } else {
          return Bad(
              "'prompt' must be a string, a list of strings, a list of token ids or a list of such "
              "lists");
        }
      }
    } else {
      return Bad("'prompt' must be a non-empty string, list of strings or list of token ids");
    }
    if (out.echo) {
      if (out.logprobs >= 0) return Bad("'echo' with 'logprobs' is not supported");
      for (const v1::GenerateRequest& r : prompts) {
        if (!r.has_prompt() && r.input_case() != v1::GenerateRequest::kPrompt) {
          return Bad("'echo' needs text prompts");
        }
      }
    }
  } else {
    if (!f.Has("messages")) return Bad("'messages' is required");
    v1::GenerateRequest r = base;
    v1::ChatInput* chat = r.mutable_chat();
    RETURN_IF_ERROR(rpc::ChatMessagesFromJson(f.Get("messages"), chat->mutable_messages()));
    if (chat->messages_size() == 0) return Bad("'messages' is empty");
    RETURN_IF_ERROR(ParseTools(f, chat, &out));
    if (f.Has("chat_template_kwargs")) {
      if (!f.Get("chat_template_kwargs").is_object())
        return Bad("'chat_template_kwargs' must be an object");
      chat->set_template_kwargs_json(f.Get("chat_template_kwargs").dump());
    }
    ASSIGN_OR_RETURN(bool generation_prompt, f.Bool("add_generation_prompt", true));
    chat->set_add_generation_prompt(generation_prompt);
    prompts.push_back(std::move(r));
    prompt_texts.emplace_back();
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int j = 0; j < out.n; ++j) {
      v1::GenerateRequest r = prompts[p];
      // n choices of one seeded request differ: choice j samples with seed + j.
      if (j > 0 && r.sampling().has_seed())
        r.mutable_sampling()->set_seed(r.sampling().seed() + static_cast<uint64_t>(j));
      out.choices.push_back(std::move(r));
      if (out.echo) out.echo_text.push_back(prompt_texts[p]);
    }
  }
  return out;
}

ApiError ErrorFor(const absl::Status& status) {
  int http = 500;
  std::string type = "server_error";
  Json code = nullptr;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      http = 400;
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      http = 401;
      type = "invalid_request_error";
      code = "invalid_api_key";
      break;
    case absl::StatusCode::kNotFound:
      http = 404;
      type = "invalid_request_error";
      code = "model_not_found";
      break;
    case absl::StatusCode::kAlreadyExists:
      http = 409;
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      http = 429;
      type = "rate_limit_error";
      code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      http = 503;
      type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      http = 504;
      type = "timeout";
      break;
    case absl::StatusCode::kCancelled:
      http = 499;
      type = "cancelled";
      break;
    default: break;
  }
  Json error = {{"message", std::string(status.message())},
                {"type", type},
                {"param", nullptr},
                {"code", code}};
  return ApiError{
      http, Json{{"error", std::move(error)}}.dump(-1, ' ', false, Json::error_handler_t::replace)};
}

int64_t CodePoints(const std::string& text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

std::string FinishReasonName(v1::FinishReason reason, bool tool_calls) {
  if (tool_calls) return "tool_calls";
  switch (reason) {
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_ABORT: return "abort";
    default: return "stop";
  }
}

namespace {

std::string TokenText(int32_t id, const Tokenizer& tokenizer) {
  const int32_t ids[] = {id};
  absl::StatusOr<std::string> text = tokenizer.Decode(ids, /*skip_special_tokens=*/false);
  return text.ok() ? *text : tokenizer.IdToToken(id);
}

Json Bytes(const std::string& s) {
  Json bytes = Json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

const char* ObjectName(const ParsedRequest& r, bool chunk) {
  if (r.endpoint == Endpoint::kCompletions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

Json Envelope(const ParsedRequest& r, const std::string& id, int64_t created, bool chunk) {
  return Json{
      {"id", id}, {"object", ObjectName(r, chunk)}, {"created", created}, {"model", r.model}};
}

Json Usage(int64_t prompt, int64_t completion) {
  return Json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion}};
}

Json ToolCallsJson(const v1::ChatOutput& output, bool with_index) {
  Json calls = Json::array();
  for (int i = 0; i < output.tool_calls_size(); ++i) {
    const v1::ToolCall& c = output.tool_calls(i);
    Json call = Json::object();
    if (with_index) call["index"] = i;
    call["id"] = c.id();
    call["type"] = "function";
    call["function"] = {{"name", c.name()}, {"arguments", c.arguments()}};
    calls.push_back(std::move(call));
  }
  return calls;
}

}  // namespace

Json DeltaLogprobs(const ParsedRequest& request, const std::vector<v1::PositionLogprobs>& logprobs,
                   const Tokenizer& tokenizer, int64_t text_offset) {
  if (request.logprobs < 0) return nullptr;
  if (request.endpoint == Endpoint::kCompletions) {
    Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
         offsets = Json::array();
    for (const v1::PositionLogprobs& p : logprobs) {
      const std::string text = TokenText(p.token_id(), tokenizer);
      tokens.push_back(text);
      token_logprobs.push_back(p.logprob());
      Json alternatives = Json::object();
      for (const v1::TokenLogprob& t : p.top())
        alternatives[TokenText(t.token_id(), tokenizer)] = t.logprob();
      top.push_back(std::move(alternatives));
      offsets.push_back(text_offset);
      text_offset += CodePoints(text);
    }
    return Json{{"tokens", std::move(tokens)},
                {"token_logprobs", std::move(token_logprobs)},
                {"top_logprobs", std::move(top)},
                {"text_offset", std::move(offsets)}};
  }
  Json content = Json::array();
  for (const v1::PositionLogprobs& p : logprobs) {
    const std::string text = TokenText(p.token_id(), tokenizer);
    Json alternatives = Json::array();
    for (const v1::TokenLogprob& t : p.top()) {
      const std::string alt = TokenText(t.token_id(), tokenizer);
      alternatives.push_back({{"token", alt}, {"logprob", t.logprob()}, {"bytes", Bytes(alt)}});
    }
    content.push_back({{"token", text},
                       {"logprob", p.logprob()},
                       {"bytes", Bytes(text)},
                       {"top_logprobs", std::move(alternatives)}});
  }
  return Json{{"content", std::move(content)}};
}

Json CompletionResponse(const ParsedRequest& request, const std::string& id, int64_t created,
                        const std::vector<ChoiceResult>& choices, const Tokenizer& tokenizer) {
  Json out = Envelope(request, id, created, /*chunk=*/false);
  Json list = Json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    if (i % static_cast<size_t>(request.n) == 0) prompt_tokens += c.final.usage().prompt_tokens();
    completion_tokens += c.final.usage().completion_tokens();
    Json choice = {{"index", static_cast<int64_t>(i)}};
    if (request.endpoint == Endpoint::kCompletions) {
      const std::string prefix = request.echo ? request.echo_text[i] : "";
      choice["text"] = prefix + c.text;
      choice["logprobs"] = DeltaLogprobs(request, c.logprobs, tokenizer, CodePoints(prefix));
      choice["finish_reason"] = FinishReasonName(c.final.finish_reason(), false);
    } else {
      const bool tools = request.parse_tool_calls && c.final.chat().tool_calls_size() > 0;
      Json message = {{"role", "assistant"}};
      if (tools) {
        message["content"] =
            c.final.chat().content().empty() ? Json(nullptr) : Json(c.final.chat().content());
        message["tool_calls"] = ToolCallsJson(c.final.chat(), /*with_index=*/false);
      } else {
        message["content"] = c.text;
      }
      choice["message"] = std::move(message);
      choice["logprobs"] = DeltaLogprobs(request, c.logprobs, tokenizer, 0);
      choice["finish_reason"] = FinishReasonName(c.final.finish_reason(), tools);
    }
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = Usage(prompt_tokens, completion_tokens);
  return out;
}

Json CompletionChunk(const ParsedRequest& request, const std::string& id, int64_t created,
                     int index, const std::string& text, const Json& logprobs,
                     const std::string& finish_reason) {
  Json out = Envelope(request, id, created, /*chunk=*/true);
  out["choices"] = Json::array(
      {{{"index", index},
        {"text", text},
        {"logprobs", logprobs},
        {"finish_reason", finish_reason.empty() ? Json(nullptr) : Json(finish_reason)}}});
  return out;
}

Json ChatChunk(const ParsedRequest& request, const std::string& id, int64_t created, int index,
               const Json& delta, const Json& logprobs, const std::string& finish_reason) {
  Json out = Envelope(request, id, created, /*chunk=*/true);
  out["choices"] = Json::array(
      {{{"index", index},
        {"delta", delta},
        {"logprobs", logprobs},
        {"finish_reason", finish_reason.empty() ? Json(nullptr) : Json(finish_reason)}}});
  return out;
}

Json UsageChunk(const ParsedRequest& request, const std::string& id, int64_t created,
                int64_t prompt_tokens, int64_t completion_tokens) {
  Json out = Envelope(request, id, created, /*chunk=*/true);
  out["choices"] = Json::array();
  out["usage"] = Usage(prompt_tokens, completion_tokens);
  return out;
}

Json ToolCallDelta(const v1::ChatOutput& output) {
  Json delta = Json::object();
  if (!output.content().empty()) delta["content"] = output.content();
  delta["tool_calls"] = ToolCallsJson(output, /*with_index=*/true);
  return delta;
}

Json ModelList(const v1::ModelInfo& model, int64_t created) {
  return Json{{"object", "list"},
              {"data", Json::array({{{"id", model.name()},
                                     {"object", "model"},
                                     {"created", created},
                                     {"owned_by", "tandem"},
                                     {"max_model_len", model.max_position_embeddings()}}})}};
}

}  // namespace tandem::router::openai
