// Batch renderer for the chat-template conformance test (chat_template_conformance.py): reads one
// JSON document on stdin,
//   {"templates": [{"name": str, "tokenizer_config": {...}, "jinja_file": str|null,
//                   "cases": [{"id": str, "messages": [...], "tools": null|[...],
//                              "add_generation_prompt": bool, "kwargs": {...}}]}]}
// renders every case with ChatTemplate::FromConfig / ChatTemplate::Render and writes
//   {"results": [{"name": str, "load_error": str|null,
//                 "cases": [{"id": str, "output": str|null, "error": str|null}]}]}
// on stdout. Every failure (a template refused at load, a render error, an exception) is recorded,
// never fatal; the exit status is non-zero only when the input itself is unreadable. JSON is kept
// in ordered_json so objects reach the templates with their keys in the order the test wrote them.
#include <cstdio>
#include <exception>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {
namespace {

using Json = nlohmann::ordered_json;

Json RenderOneCase(const ChatTemplate& tmpl, const Json& spec) {
  Json result = Json::object();
  result["id"] = spec.value("id", "");
  result["output"] = nullptr;
  result["error"] = nullptr;
  try {
    ChatRenderRequest request;
    if (spec.contains("messages")) request.messages = spec["messages"];
    if (spec.contains("tools")) request.tools = spec["tools"];
    request.add_generation_prompt = spec.value("add_generation_prompt", false);
    if (spec.contains("kwargs") && spec["kwargs"].is_object()) request.kwargs = spec["kwargs"];
    absl::StatusOr<std::string> rendered = tmpl.Render(request);
    if (rendered.ok()) {
      result["output"] = *std::move(rendered);
    } else {
      result["error"] = rendered.status().ToString();
    }
  } catch (const std::exception& e) {
    result["error"] = std::string("exception: ") + e.what();
  } catch (...) {
    result["error"] = "exception of unknown type";
  }
  return result;
}

Json RenderTemplate(const Json& spec) {
  Json result = Json::object();
  result["name"] = spec.value("name", "");
  result["load_error"] = nullptr;
  result["cases"] = Json::array();
  std::unique_ptr<ChatTemplate> tmpl;
  try {
    std::optional<std::string> jinja_file;
    if (spec.contains("jinja_file") && spec["jinja_file"].is_string()) {
      jinja_file = spec["jinja_file"].get<std::string>();
    }
    const Json config =
        spec.contains("tokenizer_config") ? spec["tokenizer_config"] : Json::object();
    absl::StatusOr<std::unique_ptr<ChatTemplate>> loaded =
        ChatTemplate::FromConfig(config, jinja_file);
    if (!loaded.ok()) {
      result["load_error"] = loaded.status().ToString();
      return result;
    }
    tmpl = *std::move(loaded);
  } catch (const std::exception& e) {
    result["load_error"] = std::string("exception: ") + e.what();
    return result;
  } catch (...) {
    result["load_error"] = "exception of unknown type";
    return result;
  }
  if (spec.contains("cases") && spec["cases"].is_array()) {
    for (const Json& c : spec["cases"]) result["cases"].push_back(RenderOneCase(*tmpl, c));
  }
  return result;
}

int Main() {
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  Json request;
  try {
    request = Json::parse(input);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chat_template_render_cases: stdin is not JSON: %s\n", e.what());
    return 2;
  }
  if (!request.contains("templates") || !request["templates"].is_array()) {
    std::fprintf(stderr, "chat_template_render_cases: stdin has no \"templates\" array\n");
    return 2;
  }
  Json out = Json::object();
  out["results"] = Json::array();
  for (const Json& spec : request["templates"]) out["results"].push_back(RenderTemplate(spec));
  // Invalid UTF-8 in an output (an engine bug) is replaced rather than thrown on, so the comparison
  // still sees the rest.
  std::cout << out.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
  return std::cout.good() ? 0 : 3;
}

}  // namespace
}  // namespace tandem::chat

int main() { return tandem::chat::Main(); }
