// libFuzzer target: a chat template (the text of a chat_template.jinja) loaded as the router loads
// one and rendered over a conversation with a system prompt, a tool call and its result, with and
// without the generation prompt: a prompt or an error, within the engine's limits.
#include <cstdint>
#include <optional>
#include <string>

#include "common/chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::ordered_json;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const ordered_json config = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  auto t = tandem::chat::ChatTemplate::FromConfig(config, text);
  if (!t.ok()) return 0;
  tandem::chat::ChatRenderRequest r;
  r.messages = ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris? ünïcödé"},
    {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function":
      {"name": "weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"c\": 21}", "tool_call_id": "1"},
    {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}])");
  r.tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  for (bool add : {false, true}) {
    r.add_generation_prompt = add;
    (void)(*t)->Render(r);
  }
  return 0;
}
