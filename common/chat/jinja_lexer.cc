#include "common/chat/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "common/chat/jinja_value.h"

namespace tandem::chat::jinja {
namespace {

[[noreturn]] void SyntaxError(int line, const std::string& message) {
  throw JinjaError(JinjaError::Kind::kSyntax, "line " + std::to_string(line) + ": " + message);
}

std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  return out;
}

// Python's str.rstrip() (Unicode whitespace).
std::string RStripPython(const std::string& text) {
  return StripPython(text, /*left=*/false, /*right=*/true);
}

bool AllPythonSpace(std::string_view text) {
  if (text.empty()) return false;
  for (char32_t cp : DecodeUtf8(text)) {
    if (!IsPythonSpace(cp)) return false;
  }
  return true;
}

// Index just past the Python whitespace (\s*) starting at `pos`.
size_t SkipPythonSpace(const std::string& s, size_t pos) {
  while (pos < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[pos]);
    if (c < 0x80) {
      if (!IsPythonSpace(c)) break;
      ++pos;
      continue;
    }
    size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    std::u32string cp = DecodeUtf8(std::string_view(s).substr(pos, len));
    if (cp.size() != 1 || !IsPythonSpace(cp[0])) break;
    pos += len;
  }
  return pos;
}

// Python's "unicode-escape" decoding of a string literal's body, as jinja2 applies it.
std::string Unescape(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    auto hex = [&](size_t digits) {
      std::string h(body.substr(i + 1, digits));
      if (h.size() != digits ||
          h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
        SyntaxError(line, "truncated \\x/\\u/\\U escape in a string literal");
      }
      i += digits;
      AppendUtf8(static_cast<char32_t>(std::strtoul(h.c_str(), nullptr, 16)), &out);
    };
    switch (c) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default:
        if (c >= '0' && c <= '7') {
          int value = c - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            value = value * 8 + (body[++i] - '0');
          }
          AppendUtf8(static_cast<char32_t>(value), &out);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : s_(std::move(source)) {
    if (!s_.empty() && s_.back() == '\n') s_.pop_back();
  }

  std::vector<Token> Run() {
    while (pos_ < s_.size()) {
      size_t start = FindTagStart(pos_);
      if (start == std::string::npos) {
        Emit(Token::Type::kText, s_.substr(pos_));
        pos_ = s_.size();
        break;
      }
      const char kind = s_[start + 1];
      char sign = start + 2 < s_.size() ? s_[start + 2] : '\0';
      if (sign != '-' && sign != '+') sign = '\0';
      std::string text = s_.substr(pos_, start - pos_);
      if (sign == '-') {
        text = RStripPython(text);
      } else if (sign != '+' && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting_) && AllPythonSpace(std::string_view(text).substr(l_pos))) {
          text.resize(l_pos);
        }
      }
      if (!text.empty()) Emit(Token::Type::kText, text);
      line_ += CountNewlines(pos_, start);
      pos_ = start + 2 + (sign != '\0' ? 1 : 0);
      if (kind == '#') {
        LexComment();
      } else if (kind == '%' && IsRawBlock()) {
        LexRaw();
      } else {
        LexTag(kind == '{');
      }
    }
    Emit(Token::Type::kEof, "");
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < s_.size(); ++i) {
      if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  int CountNewlines(size_t from, size_t to) const {
    int n = 0;
    for (size_t i = from; i < to && i < s_.size(); ++i) n += s_[i] == '\n';
    return n;
  }

  void Emit(Token::Type type, std::string value) {
    tokens_.push_back(Token{type, std::move(value), line_});
  }

  // After a tag's closing delimiter at [pos_, pos_ + 2): applies `-` (all whitespace) or
  // trim_blocks (one newline, block and comment tags only) and records whether a line starts.
  void FinishTag(bool stripped_sign, bool block_like, bool plus_sign) {
    size_t end = pos_ + 2;
    if (stripped_sign) {
      end = SkipPythonSpace(s_, end);
    } else if (block_like && !plus_sign && end < s_.size() && s_[end] == '\n') {
      ++end;
    }
    line_ += CountNewlines(pos_, end);
    line_starting_ = end > 0 && s_[end - 1] == '\n';
    pos_ = end;
  }

  void LexComment() {
    const size_t close = s_.find("#}", pos_);
    if (close == std::string::npos) SyntaxError(line_, "unterminated comment");
    const bool minus = close > pos_ && s_[close - 1] == '-';
    const bool plus = close > pos_ && s_[close - 1] == '+';
    line_ += CountNewlines(pos_, close);
    pos_ = close;
    FinishTag(minus, true, plus);
  }

  // `{% raw %}` after the `{%`: true when the tag is exactly raw.
  bool IsRawBlock() const {
    size_t i = SkipPythonSpace(s_, pos_);
    if (s_.compare(i, 3, "raw") != 0) return false;
    i = SkipPythonSpace(s_, i + 3);
    if (i < s_.size() && s_[i] == '-') ++i;
    return s_.compare(i, 2, "%}") == 0;
  }

  void LexRaw() {
    size_t i = SkipPythonSpace(s_, pos_) + 3;
    i = SkipPythonSpace(s_, i);
    const bool minus = s_[i] == '-';
    if (minus) ++i;
    pos_ = i;
    // The raw begin tag honours `-` but not trim_blocks.
    size_t end = pos_ + 2;
    if (minus) end = SkipPythonSpace(s_, end);
    line_ += CountNewlines(pos_, end);
    pos_ = end;
    // Find `{%[-+]? endraw [-+]?%}`.
    size_t search = pos_;
    while (true) {
      const size_t open = s_.find("{%", search);
      if (open == std::string::npos) SyntaxError(line_, "missing endraw");
      size_t j = open + 2;
      char sign = j < s_.size() && (s_[j] == '-' || s_[j] == '+') ? s_[j++] : '\0';
      j = SkipPythonSpace(s_, j);
      if (s_.compare(j, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      j = SkipPythonSpace(s_, j + 6);
      char end_sign = j < s_.size() && (s_[j] == '-' || s_[j] == '+') ? s_[j++] : '\0';
      if (s_.compare(j, 2, "%}") != 0) {
        search = open + 2;
        continue;
      }
      std::string text = s_.substr(pos_, open - pos_);
      if (sign == '-') {
        text = RStripPython(text);
      } else if (sign != '+') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l_pos > 0 && AllPythonSpace(std::string_view(text).substr(l_pos))) text.resize(l_pos);
      }
      if (!text.empty()) Emit(Token::Type::kText, text);
      line_ += CountNewlines(pos_, j);
      pos_ = j;
      FinishTag(end_sign == '-', true, end_sign == '+');
      return;
    }
  }

  void LexTag(bool variable) {
    Emit(variable ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "");
    int balance = 0;
    while (true) {
      if (pos_ >= s_.size())
        SyntaxError(line_, variable ? "unexpected end of template, expected '}}'"
                                    : "unexpected end of template, expected '%}'");
      const char c = s_[pos_];
      if (c == '\n') ++line_;
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
        continue;
      }
      if (balance == 0) {
        const char* close = variable ? "}}" : "%}";
        if (s_.compare(pos_, 2, close) == 0) {
          Emit(variable ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "");
          FinishTag(false, !variable, false);
          return;
        }
        if ((c == '-' || c == '+') && s_.compare(pos_ + 1, 2, close) == 0) {
          Emit(variable ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "");
          ++pos_;
          FinishTag(c == '-', !variable, c == '+');
          return;
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos_;
        while (end < s_.size() &&
               (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_'))
          ++end;
        Emit(Token::Type::kName, s_.substr(pos_, end - pos_));
        pos_ = end;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        LexNumber();
        continue;
      }
      if (c == '\'' || c == '"') {
        LexString(c);
        continue;
      }
      static const char* kOperators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/",
                                         "%",  "*",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                         "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};
      bool matched = false;
      for (const char* op : kOperators) {
        const size_t len = std::char_traits<char>::length(op);
        if (s_.compare(pos_, len, op) == 0) {
          if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++balance;
          if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && len == 1) {
            if (balance == 0) SyntaxError(line_, std::string("unexpected '") + op + "'");
            --balance;
          }
          Emit(Token::Type::kOperator, op);
          pos_ += len;
          matched = true;
          break;
        }
      }
      if (!matched) SyntaxError(line_, std::string("unexpected char '") + c + "'");
    }
  }

  void LexNumber() {
    size_t end = pos_;
    auto digits = [&] {
      while (end < s_.size() &&
             (std::isdigit(static_cast<unsigned char>(s_[end])) || s_[end] == '_'))
        ++end;
    };
    digits();
    bool is_float = false;
    if (end + 1 < s_.size() && s_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(s_[end + 1]))) {
      is_float = true;
      ++end;
      digits();
    }
    if (end < s_.size() && (s_[end] == 'e' || s_[end] == 'E')) {
      size_t e = end + 1;
      if (e < s_.size() && (s_[e] == '+' || s_[e] == '-')) ++e;
      if (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) {
        is_float = true;
        end = e;
        digits();
      }
    }
    std::string text = s_.substr(pos_, end - pos_);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    Emit(is_float ? Token::Type::kFloat : Token::Type::kInt, text);
    pos_ = end;
  }

  void LexString(char quote) {
    size_t i = pos_ + 1;
    while (i < s_.size() && s_[i] != quote) {
      if (s_[i] == '\\') ++i;
      ++i;
    }
    if (i >= s_.size()) SyntaxError(line_, "unterminated string");
    const int line = line_;
    line_ += CountNewlines(pos_, i);
    Emit(Token::Type::kString, Unescape(std::string_view(s_).substr(pos_ + 1, i - pos_ - 1), line));
    pos_ = i + 1;
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Lex(std::string_view source) { return Lexer(NormalizeNewlines(source)).Run(); }

}  // namespace tandem::chat::jinja
