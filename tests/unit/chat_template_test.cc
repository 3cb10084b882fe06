// The chat-template engine's contracts that the jinja2 conformance suite (tests/conformance/
// chat_template) cannot show: what is refused at load, hostile templates and requests failing with
// an error instead of exhausting the process, and how ChatTemplate reads a model's configuration.
#include "common/chat/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/chat/jinja.h"

namespace tandem::chat {
namespace {

using nlohmann::ordered_json;

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

absl::Status LoadError(const std::string& source) {
  auto t = JinjaTemplate::Create(source);
  return t.ok() ? absl::OkStatus() : t.status();
}

absl::StatusOr<std::string> RenderOnce(const std::string& source,
                                       const ordered_json& variables = ordered_json::object()) {
  auto t = JinjaTemplate::Create(source);
  if (!t.ok()) return t.status();
  return (*t)->Render(variables);
}

TEST(JinjaTemplateTest, RefusesWhatItDoesNotImplementAtLoad) {
  struct Case {
    std::string source;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"{% include 'x.jinja' %}", "'include' tag is not supported"},
      {"{% import 'm' as m %}", "'import' tag is not supported"},
      {"{% call f() %}x{% endcall %}", "'call' tag is not supported"},
      {"{{ x | from_json }}", "no filter named 'from_json'"},
      {"{% if x is fancy %}{% endif %}", "no test named 'fancy'"},
      {"{% for x in y recursive %}{% endfor %}", "recursive loops are not supported"},
      {"{% frobnicate %}", "unknown tag 'frobnicate'"},
      {"{% if x %}never closed", "expected 'elif'"},
      {"{{ 'unterminated }}", "unterminated string"},
      {"{{ x ", "expected '}}'"},
      {"line one\n{{ x + }}", "line 2"},
  };
  for (const Case& c : cases) {
    const absl::Status status = LoadError(c.source);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.source;
    EXPECT_NE(status.message().find(c.reason), std::string::npos)
        << c.source << " -> " << status.message();
  }
}

TEST(JinjaTemplateTest, RefusesNestingThatWouldExhaustTheStack) {
  for (const std::string& source :
       {"{{ " + Repeat("(", 5000) + "1" + Repeat(")", 5000) + " }}",
        "{{ " + Repeat("not ", 5000) + "x }}", "{{ 1" + Repeat(" + 1", 20000) + " }}",
        "{{ x" + Repeat(".a", 20000) + " }}", "{{ x" + Repeat(" | trim", 20000) + " }}",
        Repeat("{% if true %}", 5000) + Repeat("{% endif %}", 5000)}) {
    const absl::Status status = LoadError(source);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << source.substr(0, 40);
    EXPECT_NE(status.message().find("nests deeper"), std::string::npos) << status.message();
  }
  // Real templates stay far below the limit.
  EXPECT_TRUE(RenderOnce("{{ 1" + Repeat(" + 1", 100) + " }}").ok());
}

TEST(JinjaTemplateTest, HostileRendersFailWithAnError) {
  const auto recursion = RenderOnce("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}");
  ASSERT_FALSE(recursion.ok());
  EXPECT_NE(recursion.status().message().find("macro calls nested deeper"), std::string::npos);

  const auto range = RenderOnce("{{ range(1000000) | length }}");
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("Range too big"), std::string::npos);

  const auto output = RenderOnce("{% for i in range(100000) %}{% for j in range(100) %}" +
                                 std::string(1000, 'x') + "{% endfor %}{% endfor %}");
  ASSERT_FALSE(output.ok());
  EXPECT_NE(output.status().message().find("64 MiB"), std::string::npos);

  const auto deep_value = RenderOnce(
      "{% set ns = namespace(v=[]) %}{% for i in range(2000) %}{% set ns.v = [ns.v] %}{% endfor "
      "%}{{ ns.v }}");
  ASSERT_FALSE(deep_value.ok());
  EXPECT_NE(deep_value.status().message().find("nested deeper"), std::string::npos);

  ordered_json deep = "leaf";
  for (int i = 0; i < 2000; ++i) deep = ordered_json::array({deep});
  const auto deep_input = RenderOnce("{{ x | length }}", ordered_json{{"x", deep}});
  ASSERT_FALSE(deep_input.ok());
  EXPECT_NE(deep_input.status().message().find("nested deeper"), std::string::npos);
}

TEST(JinjaTemplateTest, RaiseExceptionKeepsItsMessageAndOtherErrorsNameTheLine) {
  const auto raised = RenderOnce("ok\n{{ raise_exception('Roles must alternate') }}");
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.status().message(), "Roles must alternate");
  const auto undefined = RenderOnce("a\nb\n{{ nothing.here }}");
  ASSERT_FALSE(undefined.ok());
  EXPECT_EQ(undefined.status().message(), "line 3: 'nothing' is undefined");
}

TEST(JinjaTemplateTest, RendersConcurrentlyFromOneParsedTemplate) {
  auto t = JinjaTemplate::Create(
      "{% for m in messages %}{{ loop.index }}:{{ m.content | upper }};{% endfor %}{{ n * 2 }}");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::thread> threads;
  std::vector<std::string> outputs(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      ordered_json variables = {
          {"messages", ordered_json::array({{{"content", "a"}}, {{"content", "b"}}})}, {"n", i}};
      for (int k = 0; k < 50; ++k) outputs[i] = (*t)->Render(variables).value_or("error");
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(outputs[i], "1:A;2:B;" + std::to_string(2 * i));
}

ordered_json Messages() { return ordered_json::array({{{"role", "user"}, {"content", "hi"}}}); }

TEST(ChatTemplateTest, ReadsSpecialTokensAsTransformersDoes) {
  const ordered_json config = {
      {"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
      {"eos_token", "</s>"},
      {"unk_token", nullptr},
      {"pad_token", ""},
      {"additional_special_tokens", {"<a>", {{"content", "<b>"}}}},
      {"extra_special_tokens", {{"image_token", "<img>"}}},
      {"chat_template",
       "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ pad_token is defined }}|"
       "{{ additional_special_tokens }}|{{ image_token }}|{{ eos_token_override }}"}};
  auto t = ChatTemplate::FromConfig(config, std::nullopt);
  ASSERT_TRUE(t.ok()) << t.status();
  ChatRenderRequest request;
  request.messages = Messages();
  request.kwargs = {{"eos_token_override", "x"}, {"eos_token", "<E>"}};
  EXPECT_EQ((*t)->Render(request).value(), "<s>|<E>|False|False|['<a>', '<b>']|<img>|x");
}

TEST(ChatTemplateTest, ChoosesNamedTemplatesAsTransformersDoes) {
  const ordered_json config = {
      {"chat_template", ordered_json::array({{{"name", "default"}, {"template", "D"}},
                                             {{"name", "tool_use"}, {"template", "T"}},
                                             {{"name", "rag"}, {"template", "R"}}})}};
  auto t = ChatTemplate::FromConfig(config, std::nullopt);
  ASSERT_TRUE(t.ok()) << t.status();
  ChatRenderRequest request;
  request.messages = Messages();
  EXPECT_EQ((*t)->Render(request).value(), "D");
  request.tools = ordered_json::array();
  EXPECT_EQ((*t)->Render(request).value(), "T");
  request.template_name = "rag";
  EXPECT_EQ((*t)->Render(request).value(), "R");
  request.template_name = "nope";
  const auto unknown = (*t)->Render(request);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("default, rag, tool_use"), std::string::npos)
      << unknown.status();

  auto only_rag = ChatTemplate::FromConfig(
      {{"chat_template", ordered_json::array({{{"name", "rag"}, {"template", "R"}}})}},
      std::nullopt);
  ASSERT_TRUE(only_rag.ok());
  request.template_name.clear();
  EXPECT_EQ((*only_rag)->Render(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, RefusesBadConfigurationsAndRequests) {
  EXPECT_EQ(ChatTemplate::FromConfig(ordered_json::object(), std::nullopt).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::FromConfig({{"chat_template", 3}}, std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChatTemplate::FromConfig({{"chat_template", ordered_json::array({{{"name", "x"}}})}},
                                     std::nullopt)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  const auto broken = ChatTemplate::FromConfig({{"chat_template", "{% if %}"}}, std::nullopt);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(broken.status().message().find("chat template 'default' cannot be used: line 1"),
            std::string::npos)
      << broken.status();

  auto t = ChatTemplate::FromConfig({{"chat_template", "{{ messages | length }}"}}, std::nullopt);
  ASSERT_TRUE(t.ok());
  ChatRenderRequest request;
  request.messages = ordered_json::object();
  EXPECT_EQ((*t)->Render(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.messages = Messages();
  request.tools = "not a list";
  EXPECT_EQ((*t)->Render(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.tools = nullptr;
  request.kwargs = {{"messages", ordered_json::array()}};
  EXPECT_EQ((*t)->Render(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.kwargs = ordered_json::object();
  EXPECT_EQ((*t)->Render(request).value(), "1");
}

TEST(ChatTemplateTest, LoadPrefersChatTemplateJinjaBesideTheConfig) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "chat_template_load";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  EXPECT_EQ(ChatTemplate::Load(dir).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"chat_template": "from config", "bos_token": "<s>"})";
  ChatRenderRequest request;
  request.messages = Messages();
  auto from_config = ChatTemplate::Load(dir);
  ASSERT_TRUE(from_config.ok()) << from_config.status();
  EXPECT_EQ((*from_config)->Render(request).value(), "from config");
  std::ofstream(dir / "chat_template.jinja") << "{{ bos_token }}from file\n";
  auto from_file = ChatTemplate::Load(dir);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ((*from_file)->Render(request).value(), "<s>from file");  // one trailing newline dropped
  std::ofstream(dir / "tokenizer_config.json") << "{not json";
  EXPECT_EQ(ChatTemplate::Load(dir).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::chat
