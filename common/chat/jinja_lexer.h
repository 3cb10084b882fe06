// Jinja source → tokens, with jinja2's whitespace rules as transformers configures them:
// trim_blocks (the newline after a block or comment tag is dropped), lstrip_blocks (spaces and tabs
// before a block or comment tag at the start of a line are dropped, unless the tag opens with `+`),
// `-` on either side of any tag strips all whitespace on that side, one trailing newline of the
// source is dropped (keep_trailing_newline false), and \r\n and \r become \n.
#ifndef TANDEM_COMMON_CHAT_JINJA_LEXER_H_
#define TANDEM_COMMON_CHAT_JINJA_LEXER_H_

#include <string>
#include <string_view>
#include <vector>

namespace tandem::chat::jinja {

struct Token {
  enum class Type {
    kText,        // template data, already whitespace-controlled
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // value unescaped
    kInt,
    kFloat,
    kOperator,
    kEof,
  };
  Type type;
  std::string value;
  int line = 1;
};

// Throws JinjaError(kSyntax) for an unterminated tag, comment or string, or a character that
// starts no token.
std::vector<Token> Lex(std::string_view source);

}  // namespace tandem::chat::jinja

#endif  // TANDEM_COMMON_CHAT_JINJA_LEXER_H_
