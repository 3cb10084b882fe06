// Tokens → the statement tree, following jinja2's grammar and operator precedence. Filters and
// tests the engine does not implement, and tags it does not support (include, import, extends,
// call, ...), are refused here, so that a template is refused when it is loaded rather than
// mis-rendered.
#ifndef TANDEM_COMMON_CHAT_JINJA_PARSER_H_
#define TANDEM_COMMON_CHAT_JINJA_PARSER_H_

#include <vector>

#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_lexer.h"

namespace tandem::chat::jinja {

// Throws JinjaError (kSyntax or kUnsupported) with the line.
Body Parse(const std::vector<Token>& tokens);

}  // namespace tandem::chat::jinja

#endif  // TANDEM_COMMON_CHAT_JINJA_PARSER_H_
