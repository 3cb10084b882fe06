// Tandem's Jinja engine: the subset of jinja2 that Hugging Face chat templates use, with jinja2's
// semantics in transformers' sandbox (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, the {% generation %} tag, transformers' tojson, raise_exception, strftime_now).
//
// Parsing refuses what the engine does not implement (unknown filters or tests, include/import/
// extends/call blocks, recursive loops) so that a template is refused when loaded, not
// mis-rendered. Rendering is bounded: macro recursion, loop iterations and output size have limits,
// so a hostile template fails with an error instead of exhausting the process.
//
// Thread-safety: a JinjaTemplate is immutable; Render may run concurrently.
#ifndef TANDEM_COMMON_CHAT_JINJA_H_
#define TANDEM_COMMON_CHAT_JINJA_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {

namespace jinja {
struct Node;
}  // namespace jinja

class JinjaTemplate {
 public:
  // InvalidArgument with the line for a syntax error or an unsupported construct.
  static absl::StatusOr<std::unique_ptr<JinjaTemplate>> Create(std::string_view source);

  ~JinjaTemplate();
  JinjaTemplate(const JinjaTemplate&) = delete;
  JinjaTemplate& operator=(const JinjaTemplate&) = delete;

  // Renders with `variables` (a JSON object; values become Python objects as json.loads makes
  // them). InvalidArgument for raise_exception (its message), undefined-value errors, type errors,
  // sandbox violations and exceeded limits.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables) const;

 private:
  JinjaTemplate() = default;

  std::unique_ptr<std::vector<std::unique_ptr<jinja::Node>>> body_;
};

}  // namespace tandem::chat

#endif  // TANDEM_COMMON_CHAT_JINJA_H_
