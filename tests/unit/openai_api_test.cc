// The OpenAI-compatible API's translation (router/openai_api.h): request bodies into the public
// API's requests, with every field checked and named, and results into OpenAI's shapes — including
// tool calls, which the end-to-end test's random model never emits.
#include "router/openai_api.h"

#include <gtest/gtest.h>

#include "cli/random_model.h"

namespace tandem::router::openai {
namespace {

constexpr char kModel[] = "m";

absl::StatusOr<ParsedRequest> Parse(Endpoint endpoint, const Json& body) {
  return ParseRequest(endpoint, body.dump(), kModel, /*max_logprobs=*/5);
}

const Tokenizer& TestTokenizer() {
  static const auto* tokenizer =
      Tokenizer::FromJson(MakeByteLevelTokenizerJson(512, 1), "test").value().release();
  return *tokenizer;
}

TEST(OpenAiApiTest, CompletionsBecomeOneRequestPerPromptAndChoice) {
  auto r = Parse(Endpoint::kCompletions, {{"model", "m"},
                                          {"prompt", Json::array({"a", "b"})},
                                          {"n", 2},
                                          {"seed", 10},
                                          {"max_tokens", 7},
                                          {"temperature", 0.5},
                                          {"stop", "\n"},
                                          {"logit_bias", {{"5", -100}}},
                                          {"logprobs", 3},
                                          {"top_k", 4},
                                          {"ignore_eos", true}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->choices.size(), 4u);
  EXPECT_EQ(r->choices[0].prompt(), "a");
  EXPECT_EQ(r->choices[1].prompt(), "a");
  EXPECT_EQ(r->choices[2].prompt(), "b");
  EXPECT_EQ(r->choices[0].sampling().seed(), 10u);
  EXPECT_EQ(r->choices[1].sampling().seed(), 11u);  // choice j: seed + j
  EXPECT_TRUE(r->choices[0].add_special_tokens());
  const v1::SamplingParameters& s = r->choices[3].sampling();
  EXPECT_EQ(s.max_tokens(), 7);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_EQ(s.stop(0), "\n");
  EXPECT_EQ(s.logit_bias(0).token_id(), 5);
  EXPECT_EQ(s.logprobs(), 3);
  EXPECT_EQ(s.top_k(), 4);
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_TRUE(s.skip_special_tokens());  // the HTTP default, as vLLM's
  auto ids = Parse(Endpoint::kCompletions, {{"prompt", Json::array({1, 2, 3})}});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->choices[0].prompt_token_ids().ids_size(), 3);
}

TEST(OpenAiApiTest, ChatCarriesMessagesToolsAndKwargs) {
  const Json tools = Json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  auto r = Parse(Endpoint::kChatCompletions,
                 {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
                  {"tools", tools},
                  {"max_completion_tokens", 9},
                  {"max_tokens", 3},
                  {"logprobs", true},
                  {"top_logprobs", 2},
                  {"chat_template_kwargs", {{"enable_thinking", false}}},
                  {"stream", true},
                  {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->choices.size(), 1u);
  const v1::GenerateRequest& g = r->choices[0];
  EXPECT_EQ(g.chat().messages(0).content(), "hi");
  EXPECT_EQ(Json::parse(g.chat().tools_json()), tools);
  EXPECT_EQ(g.chat().template_kwargs_json(), R"({"enable_thinking":false})");
  EXPECT_TRUE(g.chat().add_generation_prompt());
  EXPECT_EQ(g.sampling().max_tokens(), 9);  // max_completion_tokens wins
  EXPECT_EQ(g.sampling().logprobs(), 2);
  EXPECT_TRUE(r->parse_tool_calls);
  EXPECT_TRUE(r->stream && r->include_usage);
  auto none = Parse(Endpoint::kChatCompletions,
                    {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
                     {"tools", tools},
                     {"tool_choice", "none"}});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->parse_tool_calls);
  EXPECT_EQ(none->choices[0].chat().tool_choice().mode(), v1::ToolChoice::MODE_NONE);
}

TEST(OpenAiApiTest, ToolChoiceAndResponseFormatBecomeStructuredOutput) {
  const Json tools = Json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  const Json messages = Json::array({{{"role", "user"}, {"content", "hi"}}});
  auto named = Parse(Endpoint::kChatCompletions,
                     {{"messages", messages},
                      {"tools", tools},
                      {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}});
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_TRUE(named->forced_tool_calls && named->parse_tool_calls);
  EXPECT_EQ(named->choices[0].chat().tool_choice().mode(), v1::ToolChoice::MODE_FUNCTION);
  EXPECT_EQ(named->choices[0].chat().tool_choice().function_name(), "f");
  auto required = Parse(Endpoint::kChatCompletions, {{"messages", messages},
                                                     {"tools", tools},
                                                     {"tool_choice", "required"},
                                                     {"parallel_tool_calls", false}});
  ASSERT_TRUE(required.ok()) << required.status();
  EXPECT_EQ(required->choices[0].chat().tool_choice().mode(), v1::ToolChoice::MODE_REQUIRED);
  EXPECT_FALSE(required->choices[0].chat().tool_choice().parallel_tool_calls());

  const Json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  auto shaped =
      Parse(Endpoint::kChatCompletions,
            {{"messages", messages},
             {"response_format",
              {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}}}}}});
  ASSERT_TRUE(shaped.ok()) << shaped.status();
  EXPECT_EQ(Json::parse(shaped->choices[0].sampling().structured_output().json_schema()), schema);
  auto object = Parse(Endpoint::kCompletions,
                      {{"prompt", "x"}, {"response_format", {{"type", "json_object"}}}});
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_TRUE(object->choices[0].sampling().structured_output().json_object());
  auto guided = Parse(Endpoint::kCompletions, {{"prompt", "x"}, {"guided_json", schema.dump()}});
  ASSERT_TRUE(guided.ok()) << guided.status();
  EXPECT_EQ(Json::parse(guided->choices[0].sampling().structured_output().json_schema()), schema);
  auto text =
      Parse(Endpoint::kCompletions, {{"prompt", "x"}, {"response_format", {{"type", "text"}}}});
  ASSERT_TRUE(text.ok());
  EXPECT_FALSE(text->choices[0].sampling().has_structured_output());
}

TEST(OpenAiApiTest, BadRequestsNameTheField) {
  struct Case {
    Endpoint endpoint;
    std::string body;
    std::string needle;
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  };
  const Endpoint c = Endpoint::kCompletions, chat = Endpoint::kChatCompletions;
  for (
      const Case& k : std::vector<Case>{
          {c, "{", "not valid JSON"},
          {c, "[]", "must be a JSON object"},
          {c, R"({"prompt": "x", "model": "other"})", "does not exist",
           absl::StatusCode::kNotFound},
          {c, R"({"prompt": "x", "bogus": 1})", "unrecognized request argument supplied: bogus"},
          {c, R"({"prompt": "x", "messages": []})",
           "unrecognized request argument supplied: messages"},
          {c, R"({})", "'prompt' is required"},
          {c, R"({"prompt": []})", "'prompt'"},
          {c, R"({"prompt": "x", "temperature": "hot"})", "'temperature' must be a number"},
          {c, R"({"prompt": "x", "n": 0})", "'n' must be in [1, 128]"},
          {c, R"({"prompt": "x", "max_tokens": 1.5})", "'max_tokens' must be an integer"},
          {c, R"({"prompt": "x", "logprobs": 9})", "'logprobs' must be in [0, 5]"},
          {c, R"({"prompt": "x", "stop": [1]})", "'stop'"},
          {c, R"({"prompt": "x", "logit_bias": {"a": 1}})", "'logit_bias' key"},
          {c, R"({"prompt": "x", "logit_bias": {"1": 500}})", "[-100, 100]"},
          {c, R"({"prompt": "x", "stream_options": {"include_usage": true}})",
           "only allowed with 'stream': true"},
          {c, R"({"prompt": "x", "suffix": "y"})", "'suffix' is not supported"},
          {c, R"({"prompt": "x", "echo": true, "logprobs": 1})", "'echo' with 'logprobs'"},
          {c, R"({"prompt": "x", "seed": -1})", "'seed'"},
          {chat, R"({})", "'messages' is required"},
          {chat, R"({"messages": []})", "'messages' is empty"},
          {chat, R"({"messages": [{"role": "user", "content": 1}]})", "messages[0].content"},
          {chat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
           "needs 'logprobs': true"},
          {chat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x"}]})",
           "'tools[0]'"},
          {chat, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
           "needs 'tools'"},
          {chat,
           R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
               "function": {"name": "f"}}], "tool_choice": {"type": "function"}})",
           "a named 'tool_choice'"},
          {chat,
           R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})",
           "'response_format' type \"xml\""},
          {chat,
           R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}})",
           "needs \"json_schema\""},
          {c, R"({"prompt": "x", "response_format": {"type": "json_object"}, "guided_json": {}})",
           "give one"},
          {c, R"({"prompt": "x", "guided_json": 3})", "'guided_json' must be"},
          {chat, R"({"messages": [{"role": "user", "content": "x"}], "prompt": "y"})",
           "unrecognized request argument"},
      }) {
    auto r = ParseRequest(k.endpoint, k.body, kModel, 5);
    EXPECT_EQ(r.status().code(), k.code) << k.body << " -> " << r.status();
    EXPECT_NE(r.status().message().find(k.needle), std::string::npos)
        << k.body << " -> " << r.status();
  }
}

TEST(OpenAiApiTest, ErrorsHaveOpenAisShapeAndStatus) {
  const std::pair<absl::Status, int> cases[] = {
      {absl::InvalidArgumentError("x"), 400},   {absl::NotFoundError("x"), 404},
      {absl::ResourceExhaustedError("x"), 429}, {absl::UnavailableError("x"), 503},
      {absl::DeadlineExceededError("x"), 504},  {absl::InternalError("x"), 500}};
  for (const auto& [status, http] : cases) {
    const ApiError e = ErrorFor(status);
    EXPECT_EQ(e.http_status, http);
    const Json body = Json::parse(e.body);
    EXPECT_EQ(body["error"]["message"], "x");
    EXPECT_TRUE(body["error"].contains("type") && body["error"].contains("param") &&
                body["error"].contains("code"));
  }
  EXPECT_EQ(Json::parse(ErrorFor(absl::NotFoundError("m")).body)["error"]["code"],
            "model_not_found");
}

TEST(OpenAiApiTest, ChatResponsesReportParsedToolCalls) {
  auto r = Parse(Endpoint::kChatCompletions,
                 {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
                  {"tools", Json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})}});
  ASSERT_TRUE(r.ok());
  ChoiceResult c;
  c.text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
  c.final.set_finish_reason(v1::FINISH_REASON_STOP);
  c.final.mutable_usage()->set_prompt_tokens(11);
  c.final.mutable_usage()->set_completion_tokens(4);
  v1::ToolCall* call = c.final.mutable_chat()->add_tool_calls();
  call->set_id("call_1");
  call->set_type("function");
  call->set_name("f");
  call->set_arguments("{\"x\": 1}");
  const Json out = CompletionResponse(*r, "chatcmpl-1", 5, {c}, TestTokenizer());
  EXPECT_EQ(out["object"], "chat.completion");
  const Json& choice = out["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"x\": 1}");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(out["usage"]["total_tokens"], 15);
  const Json delta = ToolCallDelta(c.final.chat());
  EXPECT_EQ(delta["tool_calls"][0]["index"], 0);
  EXPECT_FALSE(delta.contains("content"));
  // Without tools the raw text is the content.
  auto plain = Parse(Endpoint::kChatCompletions,
                     {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}});
  const Json plain_out = CompletionResponse(*plain, "chatcmpl-2", 5, {c}, TestTokenizer());
  EXPECT_EQ(plain_out["choices"][0]["message"]["content"], c.text);
  EXPECT_EQ(plain_out["choices"][0]["finish_reason"], "stop");
}

TEST(OpenAiApiTest, LogprobsTakeEachEndpointsShape) {
  auto completions = Parse(Endpoint::kCompletions, {{"prompt", "x"}, {"logprobs", 1}});
  auto chat = Parse(
      Endpoint::kChatCompletions,
      {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}, {"logprobs", true}});
  ASSERT_TRUE(completions.ok() && chat.ok());
  std::vector<v1::PositionLogprobs> lp(2);
  lp[0].set_token_id('a');
  lp[0].set_logprob(-0.5f);
  v1::TokenLogprob* alt = lp[0].add_top();
  alt->set_token_id('b');
  alt->set_logprob(-1.0f);
  lp[1].set_token_id('c');
  lp[1].set_logprob(-0.25f);
  const Json a = DeltaLogprobs(*completions, lp, TestTokenizer(), 3);
  EXPECT_EQ(a["token_logprobs"].size(), 2u);
  EXPECT_EQ(a["text_offset"][0], 3);
  EXPECT_EQ(a["top_logprobs"][0].size(), 1u);
  const Json b = DeltaLogprobs(*chat, lp, TestTokenizer(), 0);
  EXPECT_EQ(b["content"].size(), 2u);
  EXPECT_DOUBLE_EQ(b["content"][0]["logprob"].get<double>(), -0.5);
  EXPECT_TRUE(b["content"][0]["bytes"].is_array());
  EXPECT_TRUE(
      DeltaLogprobs(*Parse(Endpoint::kCompletions, {{"prompt", "x"}}), lp, TestTokenizer(), 0)
          .is_null());
}

}  // namespace
}  // namespace tandem::router::openai
