// Chat requests between the public API's ChatInput, OpenAI-style JSON messages and the template's
// input (common/rpc/chat_convert.h), and tool calls parsed out of generated text
// (common/chat/tool_calls.h).
#include "common/rpc/chat_convert.h"

#include <gtest/gtest.h>

#include <string>

#include "common/chat/tool_calls.h"

namespace tandem {
namespace {

using chat::ParseToolCalls;
using chat::ToolCallFormat;
using nlohmann::ordered_json;

TEST(ToolCallsTest, HermesCallsAreParsedWithTheTextBeforeThem) {
  const auto out = ParseToolCalls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"n\": 1.5}}\n"
      "</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": \"{\\\"tz\\\": "
      "\\\"UTC\\\"}\"}</tool_call>",
      ToolCallFormat::kHermes);
  EXPECT_EQ(out.content, "Let me check.\n");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(out.tool_calls[0].arguments,
            "{\"city\": \"Paris\", \"n\": 1.5}");  // json.dumps spacing
  EXPECT_EQ(out.tool_calls[1].name, "now");
  EXPECT_EQ(out.tool_calls[1].arguments, "{\"tz\": \"UTC\"}");
  // Generation stopped before the closing tag: a complete body still counts.
  const auto open = ParseToolCalls("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n",
                                   ToolCallFormat::kHermes);
  ASSERT_EQ(open.tool_calls.size(), 1u);
  EXPECT_EQ(open.content, "");
}

TEST(ToolCallsTest, MalformedCallsLeaveAllTheTextAsContent) {
  for (const std::string text :
       {"<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
        "ok <tool_call>{\"name\": \"f\"}</tool_call><tool_call>nope</tool_call>"}) {
    const auto out = ParseToolCalls(text, ToolCallFormat::kHermes);
    EXPECT_TRUE(out.tool_calls.empty()) << text;
    EXPECT_EQ(out.content, text);
  }
  const auto plain = ParseToolCalls("no calls here", ToolCallFormat::kHermes);
  EXPECT_EQ(plain.content, "no calls here");
  EXPECT_TRUE(plain.tool_calls.empty());
}

TEST(ToolCallsTest, Llama3JsonCallsAreTheWholeOutput) {
  const auto out = ParseToolCalls(
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"}{\\\"\"}}; {\"name\": \"b\", "
      "\"arguments\": {}}",
      ToolCallFormat::kLlama3Json);
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].name, "a");
  EXPECT_EQ(out.tool_calls[0].arguments, "{\"s\": \"}{\\\"\"}");
  EXPECT_EQ(out.tool_calls[1].name, "b");
  EXPECT_EQ(out.content, "");
  for (const std::string text :
       {"The answer is {\"name\": 1}", "{\"name\": \"a\", \"parameters\": {}} trailing",
        "{\"name\": \"a\", \"parameters\": {"}) {
    const auto kept = ParseToolCalls(text, ToolCallFormat::kLlama3Json);
    EXPECT_TRUE(kept.tool_calls.empty()) << text;
    EXPECT_EQ(kept.content, text);
  }
}

TEST(ToolCallsTest, FormatsAreNamedAndDetectedFromTheTemplate) {
  EXPECT_EQ(chat::ParseToolCallFormat("hermes").value(), ToolCallFormat::kHermes);
  EXPECT_EQ(chat::ParseToolCallFormat("llama3_json").value(), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(chat::ParseToolCallFormat("none").value(), ToolCallFormat::kNone);
  EXPECT_EQ(chat::ParseToolCallFormat("qwen_xml").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chat::DetectToolCallFormat("... <tool_call>\\n{{ call | tojson }}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(chat::DetectToolCallFormat("{{ '<|python_tag|>' }}"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(chat::DetectToolCallFormat("{{ messages }}"), ToolCallFormat::kNone);
}

TEST(ChatConvertTest, OpenAiMessagesReachTheTemplateAsVllmHandsThemOver) {
  const ordered_json messages = ordered_json::parse(R"([
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "hi"}], "custom": {"x": 1}},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": [1, 2.5]}"}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"},
    {"role": "assistant", "content": "done", "reasoning_content": "think"}
  ])");
  v1::ChatInput input;
  ASSERT_TRUE(rpc::ChatMessagesFromJson(messages, input.mutable_messages()).ok());
  input.set_tools_json(R"([{"type": "function", "function": {"name": "f"}}])");
  input.set_template_kwargs_json(R"({"enable_thinking": false})");
  auto request = rpc::ChatRenderRequestFromProto(input);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_TRUE(request->add_generation_prompt);  // unset: on
  EXPECT_EQ(request->kwargs.dump(), R"({"enable_thinking":false})");
  EXPECT_EQ(request->tools.size(), 1u);
  EXPECT_EQ(
      request->messages.dump(),
      R"([{"role":"system","content":"be brief"},)"
      R"({"role":"user","content":[{"type":"text","text":"hi"}],"custom":{"x":1}},)"
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"a":[1,2.5]}}}]},)"
      R"({"role":"tool","content":"42","tool_call_id":"c1","name":"f"},)"
      R"({"role":"assistant","content":"done","reasoning_content":"think"}])");
  input.set_add_generation_prompt(false);
  EXPECT_FALSE(rpc::ChatRenderRequestFromProto(input)->add_generation_prompt);
}

TEST(ChatConvertTest, BadFieldsAreNamed) {
  struct Case {
    std::string messages;
    std::string field;
  };
  for (
      const Case& c : std::vector<Case>{
          {R"({"role": "user"})", "messages must be a JSON array"},
          {R"([{"content": "x"}])", "messages[0].role is missing"},
          {R"([{"role": 3}])", "messages[0].role must be a string"},
          {R"([{"role": "user", "content": 5}])", "messages[0].content must be a string"},
          {R"([{"role": "user", "content": [{"text": "x"}]}])", "messages[0].content[0]"},
          {R"([{"role": "assistant", "tool_calls": [{"function": {}}]}])",
           "messages[0].tool_calls[0]"},
          {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}])",
           "messages[0].tool_calls[0].function.arguments"},
      }) {
    v1::ChatInput input;
    const absl::Status s =
        rpc::ChatMessagesFromJson(ordered_json::parse(c.messages), input.mutable_messages());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.messages;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
  }
  v1::ChatInput input;
  EXPECT_NE(
      rpc::ChatRenderRequestFromProto(input).status().message().find("chat.messages is empty"),
      std::string::npos);
  v1::ChatMessage* m = input.add_messages();
  m->set_role("assistant");
  v1::ToolCall* call = m->add_tool_calls();
  call->set_name("f");
  call->set_arguments("not json");
  EXPECT_NE(rpc::ChatRenderRequestFromProto(input).status().message().find(
                "chat.messages[0].tool_calls[0].arguments"),
            std::string::npos);
  call->set_arguments("{}");
  m->set_extra_json(R"({"role": "x"})");
  EXPECT_NE(rpc::ChatRenderRequestFromProto(input).status().message().find("sets \"role\""),
            std::string::npos);
  m->clear_extra_json();
  input.set_tools_json("{}");
  EXPECT_NE(rpc::ChatRenderRequestFromProto(input).status().message().find(
                "chat.tools_json must be a JSON array"),
            std::string::npos);
  input.clear_tools_json();
  input.set_template_kwargs_json("[1]");
  EXPECT_NE(rpc::ChatRenderRequestFromProto(input).status().message().find(
                "template_kwargs_json must be a JSON object"),
            std::string::npos);
}

TEST(ChatConvertTest, OutputCarriesIdsAndOpenAiShape) {
  const v1::ChatOutput out = rpc::ChatOutputFromText(
      "x<tool_call>{\"name\": \"f\", \"arguments\": {\"k\": true}}</tool_call>",
      ToolCallFormat::kHermes, "req-1");
  EXPECT_EQ(out.content(), "x");
  ASSERT_EQ(out.tool_calls_size(), 1);
  EXPECT_EQ(out.tool_calls(0).id().rfind("call_", 0), 0u);
  EXPECT_EQ(out.tool_calls(0).id(),
            rpc::ChatOutputFromText("<tool_call>{\"name\": \"g\"}</tool_call>",
                                    ToolCallFormat::kHermes, "req-1")
                .tool_calls(0)
                .id());  // stable for a request and index
  const ordered_json json = rpc::ChatOutputToJson(out);
  EXPECT_EQ(json["tool_calls"][0]["function"]["arguments"], "{\"k\": true}");
  EXPECT_EQ(json["tool_calls"][0]["type"], "function");
  EXPECT_EQ(json["content"], "x");
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// What a streamer gives out over the pieces, then Finish's rest: the parsed content, exactly.
std::string Stream(chat::ToolCallFormat format, const std::vector<std::string>& pieces,
                   std::string* rest, chat::ParsedChatOutput* parsed,
                   std::vector<std::string>* sent = nullptr) {
  chat::ToolCallStreamer streamer(format);
  std::string out;
  for (const std::string& p : pieces) {
    const std::string now = streamer.Add(p);
    if (sent != nullptr) sent->push_back(now);
    out += now;
  }
  *parsed = streamer.Finish(rest);
  return out;
}

TEST(ToolCallStreamerTest, HermesContentStreamsUntilACallMayStart) {
  std::string rest;
  chat::ParsedChatOutput parsed;
  std::vector<std::string> sent;
  const std::string streamed = Stream(chat::ToolCallFormat::kHermes,
                                      {"Let me ", "check <", "tool", "_call>\n{\"name\": \"f\", ",
                                       "\"arguments\": {}}\n</tool_call>"},
                                      &rest, &parsed, &sent);
  EXPECT_EQ(sent[0], "Let me ");
  EXPECT_EQ(sent[1], "check ");  // "<" may open a call: held
  EXPECT_EQ(streamed, "Let me check ");
  EXPECT_EQ(streamed + rest, parsed.content);
  ASSERT_EQ(parsed.tool_calls.size(), 1u);
  // A "<" that turns out to be text is released with what follows.
  const std::string text = Stream(chat::ToolCallFormat::kHermes, {"a <", "b> c"}, &rest, &parsed);
  EXPECT_EQ(text, "a <b> c");
  EXPECT_EQ(rest, "");
  // A malformed call: the held text comes back as content at the end.
  const std::string broken =
      Stream(chat::ToolCallFormat::kHermes, {"x<tool_call>{oops"}, &rest, &parsed);
  EXPECT_EQ(broken, "x");
  EXPECT_EQ(rest, "<tool_call>{oops");
  EXPECT_TRUE(parsed.tool_calls.empty());
}

TEST(ToolCallStreamerTest, Llama3JsonHoldsAnOutputThatStartsAsACall) {
  std::string rest;
  chat::ParsedChatOutput parsed;
  EXPECT_EQ(Stream(chat::ToolCallFormat::kLlama3Json,
                   {" ", "{\"name\": \"f\", ", "\"parameters\": {}}"}, &rest, &parsed),
            "");
  EXPECT_EQ(parsed.tool_calls.size(), 1u);
  EXPECT_EQ(rest, "");
  EXPECT_EQ(Stream(chat::ToolCallFormat::kLlama3Json, {"The ", "answer {x}"}, &rest, &parsed),
            "The answer {x}");
  EXPECT_TRUE(parsed.tool_calls.empty());
  EXPECT_EQ(Stream(chat::ToolCallFormat::kLlama3Json, {"{not json"}, &rest, &parsed) + rest,
            "{not json");
  EXPECT_EQ(Stream(chat::ToolCallFormat::kNone, {"a", "<tool_call>"}, &rest, &parsed),
            "a<tool_call>");
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(ToolCallsTest, MistralCallsInBothOfItsFormats) {
  const auto v3 = chat::ParseToolCalls(
      "Sure.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abcdefghi\"}, "
      "{\"name\": \"g\", "
      "\"arguments\": {}}]",
      chat::ToolCallFormat::kMistral);
  EXPECT_EQ(v3.content, "Sure.");
  ASSERT_EQ(v3.tool_calls.size(), 2u);
  EXPECT_EQ(v3.tool_calls[0].name, "f");
  EXPECT_EQ(v3.tool_calls[0].arguments, "{\"a\": 1}");
  const auto v7 =
      chat::ParseToolCalls("[TOOL_CALLS]f[CALL_ID]abcdefghi[ARGS]{\"a\": [1]}[TOOL_CALLS]g[ARGS]{}",
                           chat::ToolCallFormat::kMistral);
  EXPECT_EQ(v7.content, "");
  ASSERT_EQ(v7.tool_calls.size(), 2u);
  EXPECT_EQ(v7.tool_calls[0].name, "f");
  EXPECT_EQ(v7.tool_calls[0].arguments, "{\"a\": [1]}");
  EXPECT_EQ(v7.tool_calls[1].name, "g");
  for (const std::string bad :
       {"[TOOL_CALLS][{\"name\": 1}]", "[TOOL_CALLS]f{\"a\": 1}", "[TOOL_CALLS][ARGS]{}"}) {
    const auto out = chat::ParseToolCalls(bad, chat::ToolCallFormat::kMistral);
    EXPECT_TRUE(out.tool_calls.empty()) << bad;
    EXPECT_EQ(out.content, bad);
  }
  EXPECT_EQ(chat::DetectToolCallFormat("{{- '[TOOL_CALLS][' }}"), chat::ToolCallFormat::kMistral);
  EXPECT_EQ(chat::ParseToolCallFormat("mistral").value(), chat::ToolCallFormat::kMistral);
  std::string rest;
  chat::ParsedChatOutput parsed;
  EXPECT_EQ(
      Stream(chat::ToolCallFormat::kMistral, {"ok [TOOL", "_CALLS]f[ARGS]{}"}, &rest, &parsed),
      "ok ");
  EXPECT_EQ(parsed.tool_calls.size(), 1u);
}

TEST(ToolCallsTest, AForcedChoiceIsAJsonArrayOfCallsUnderTheToolsSchemas) {
  const std::string tools = R"([{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}},
      {"type": "function", "function": {"name": "g"}}])";
  const ordered_json any = ordered_json::parse(*chat::ForcedToolCallSchema(tools, "", true));
  EXPECT_EQ(any["minItems"], 1);
  EXPECT_FALSE(any.contains("maxItems"));
  ASSERT_EQ(any["items"]["anyOf"].size(), 2u);
  EXPECT_EQ(any["items"]["anyOf"][0]["properties"]["name"]["const"], "f");
  EXPECT_EQ(any["items"]["anyOf"][0]["properties"]["arguments"]["required"][0], "x");
  EXPECT_EQ(any["items"]["anyOf"][1]["properties"]["arguments"]["additionalProperties"], false);
  const ordered_json one = ordered_json::parse(*chat::ForcedToolCallSchema(tools, "g", true));
  EXPECT_EQ(one["maxItems"], 1);
  EXPECT_EQ(one["items"]["properties"]["name"]["const"], "g");
  EXPECT_EQ(ordered_json::parse(*chat::ForcedToolCallSchema(tools, "", false))["maxItems"], 1);
  EXPECT_FALSE(chat::ForcedToolCallSchema(tools, "h", true).ok());
  EXPECT_FALSE(chat::ForcedToolCallSchema("[]", "", true).ok());

  const auto calls =
      ParseToolCalls(R"( [{"name": "f", "arguments": {"x": 1}}, {"name":"g","arguments":{}}])",
                     ToolCallFormat::kJsonArray);
  ASSERT_EQ(calls.tool_calls.size(), 2u);
  EXPECT_EQ(calls.tool_calls[0].arguments, R"({"x": 1})");
  EXPECT_EQ(calls.tool_calls[1].name, "g");
  EXPECT_EQ(calls.content, "");
  // Cut short (max_tokens): no calls, the text is content.
  const auto cut = ParseToolCalls(R"([{"name": "f", "argu)", ToolCallFormat::kJsonArray);
  EXPECT_TRUE(cut.tool_calls.empty());
  EXPECT_EQ(cut.content, R"([{"name": "f", "argu)");
  chat::ToolCallStreamer streamer(ToolCallFormat::kJsonArray);
  EXPECT_EQ(streamer.Add("[{\"name\""), "");
  std::string rest;
  EXPECT_EQ(streamer.Finish(&rest).content, "[{\"name\"");
}

}  // namespace
}  // namespace tandem
