#include "common/chat/jinja_parser.h"

#include <cstdlib>
#include <initializer_list>
#include <string_view>

#include "common/chat/jinja_builtins.h"

namespace tandem::chat::jinja {
namespace {

// Nesting deeper than this (parentheses, `not`, unary signs, blocks) is refused rather than parsed
// recursively to a stack overflow.
constexpr int kMaxDepth = 256;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Body ParseTemplate() {
    Body body = ParseBody({});
    if (Peek().type != Token::Type::kEof) Fail("unexpected tag");
    return body;
  }

 private:
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& parser) : parser_(parser) {
      if (++parser_.depth_ > kMaxDepth)
        parser_.Fail("the template nests deeper than 256 levels", JinjaError::Kind::kUnsupported);
    }
    ~DepthGuard() { --parser_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Parser& parser_;
  };

  // A loop that builds a left-deep chain (a + b + c ...) deepens the tree by one per link.
  void Deepen(int& links) {
    ++links;
    if (++depth_ > kMaxDepth)
      Fail("the template nests deeper than 256 levels", JinjaError::Kind::kUnsupported);
  }
  ExprPtr Undeepen(int links, ExprPtr e) {
    depth_ -= links;
    return e;
  }

  const Token& Peek(size_t ahead = 0) const {
    const size_t i = std::min(pos_ + ahead, tokens_.size() - 1);
    return tokens_[i];
  }
  const Token& Next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).type == Token::Type::kOperator && Peek(ahead).value == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).type == Token::Type::kName && Peek(ahead).value == name;
  }
  [[noreturn]] void Fail(const std::string& message,
                         JinjaError::Kind kind = JinjaError::Kind::kSyntax) const {
    throw JinjaError(kind, "line " + std::to_string(Peek().line) + ": " + message);
  }
  void ExpectOp(std::string_view op) {
    if (!IsOp(op)) Fail("expected '" + std::string(op) + "'");
    Next();
  }
  void ExpectName(std::string_view name) {
    if (!IsName(name)) Fail("expected '" + std::string(name) + "'");
    Next();
  }
  std::string ExpectIdentifier() {
    if (Peek().type != Token::Type::kName) Fail("expected a name");
    return Next().value;
  }
  void ExpectBlockEnd() {
    if (Peek().type != Token::Type::kBlockEnd)
      Fail("expected end of statement block, got '" + Peek().value + "'");
    Next();
  }

  ExprPtr Make(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = Peek().line;
    return e;
  }

  // Statements until a `{% name %}` with name in `ends` (left unconsumed, after the `{%`).
  Body ParseBody(std::initializer_list<std::string_view> ends) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.type == Token::Type::kEof) {
        if (ends.size() != 0)
          Fail("unexpected end of template, expected '" + std::string(*ends.begin()) + "'");
        return body;
      }
      if (t.type == Token::Type::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->text = Next().value;
        body.push_back(std::move(node));
        continue;
      }
      if (t.type == Token::Type::kVarBegin) {
        Next();
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->line = Peek().line;
        node->expr = ParseTuple(false);
        if (Peek().type != Token::Type::kVarEnd)
          Fail("expected end of print statement, got '" + Peek().value + "'");
        Next();
        body.push_back(std::move(node));
        continue;
      }
      if (t.type != Token::Type::kBlockBegin) Fail("unexpected token");
      if (Peek(1).type == Token::Type::kName) {
        for (std::string_view end : ends) {
          if (Peek(1).value == end) {
            Next();
            return body;
          }
        }
      }
      Next();
      body.push_back(ParseStatement());
    }
  }

  std::unique_ptr<Node> ParseStatement() {
    if (Peek().type != Token::Type::kName) Fail("tag name expected");
    const std::string tag = Peek().value;
    const int line = Peek().line;
    auto node = std::make_unique<Node>();
    node->line = line;
    Next();
    if (tag == "if") {
      node->kind = Node::Kind::kIf;
      node->conditions.push_back(ParseTuple(false));
      ExpectBlockEnd();
      while (true) {
        node->bodies.push_back(ParseBody({"elif", "else", "endif"}));
        const std::string which = Next().value;
        if (which == "elif") {
          node->conditions.push_back(ParseTuple(false));
          ExpectBlockEnd();
          continue;
        }
        if (which == "else") {
          ExpectBlockEnd();
          node->else_body = ParseBody({"endif"});
          Next();
        }
        ExpectBlockEnd();
        break;
      }
    } else if (tag == "for") {
      node->kind = Node::Kind::kFor;
      ParseTargets(*node, /*allow_attribute=*/false);
      ExpectName("in");
      node->expr = ParseTuple(/*no_condition=*/true);
      if (IsName("if")) {
        Next();
        node->condition = ParseExpression();
      }
      if (IsName("recursive"))
        Fail("recursive loops are not supported", JinjaError::Kind::kUnsupported);
      ExpectBlockEnd();
      node->body = ParseBody({"endfor", "else"});
      if (Next().value == "else") {
        ExpectBlockEnd();
        node->else_body = ParseBody({"endfor"});
        Next();
      }
      ExpectBlockEnd();
    } else if (tag == "set") {
      ParseTargets(*node, /*allow_attribute=*/true);
      if (IsOp("=")) {
        node->kind = Node::Kind::kSet;
        Next();
        node->expr = ParseTuple(false);
        ExpectBlockEnd();
      } else {
        node->kind = Node::Kind::kSetBlock;
        if (node->unpack) Fail("a block set takes one target");
        if (IsOp("|")) node->filter = ParseFilterChain(nullptr);
        ExpectBlockEnd();
        node->body = ParseBody({"endset"});
        Next();
        ExpectBlockEnd();
      }
    } else if (tag == "macro") {
      node->kind = Node::Kind::kMacro;
      node->name = ExpectIdentifier();
      ExpectOp("(");
      while (!IsOp(")")) {
        if (!node->params.empty()) ExpectOp(",");
        if (IsOp(")")) break;
        node->params.push_back(ExpectIdentifier());
        if (IsOp("=")) {
          Next();
          node->defaults.push_back(ParseExpression());
        } else {
          node->defaults.push_back(nullptr);
        }
      }
      Next();
      ExpectBlockEnd();
      node->body = ParseBody({"endmacro"});
      Next();
      if (Peek().type == Token::Type::kName) Next();  // {% endmacro name %}
      ExpectBlockEnd();
    } else if (tag == "filter") {
      node->kind = Node::Kind::kFilterBlock;
      node->filter = ParseFilterChain(nullptr, /*first_has_pipe=*/false);
      ExpectBlockEnd();
      node->body = ParseBody({"endfilter"});
      Next();
      ExpectBlockEnd();
    } else if (tag == "with") {
      node->kind = Node::Kind::kWith;
      while (Peek().type != Token::Type::kBlockEnd) {
        if (!node->targets.empty()) ExpectOp(",");
        node->targets.push_back(Target{ExpectIdentifier(), ""});
        ExpectOp("=");
        node->values.push_back(ParseExpression());
      }
      ExpectBlockEnd();
      node->body = ParseBody({"endwith"});
      Next();
      ExpectBlockEnd();
    } else if (tag == "break" || tag == "continue") {
      node->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      ExpectBlockEnd();
    } else if (tag == "generation") {
      node->kind = Node::Kind::kScope;
      ExpectBlockEnd();
      node->body = ParseBody({"endgeneration"});
      Next();
      ExpectBlockEnd();
    } else {
      static constexpr std::string_view kKnown[] = {"include", "import", "from", "extends",
                                                    "block",   "call",   "do",   "autoescape",
                                                    "trans",   "raw"};
      for (std::string_view known : kKnown) {
        if (tag == known)
          Fail("the '" + tag + "' tag is not supported", JinjaError::Kind::kUnsupported);
      }
      Fail("unknown tag '" + tag + "'");
    }
    return node;
  }

  void ParseTargets(Node& node, bool allow_attribute) {
    const bool parenthesised = IsOp("(");
    if (parenthesised) Next();
    while (true) {
      Target target{ExpectIdentifier(), ""};
      if (allow_attribute && IsOp(".")) {
        Next();
        target.attribute = ExpectIdentifier();
      }
      node.targets.push_back(std::move(target));
      if (!IsOp(",")) break;
      node.unpack = true;
      Next();
      if (Peek().type != Token::Type::kName) break;
    }
    if (parenthesised) {
      node.unpack = true;
      ExpectOp(")");
    }
  }

  // jinja2's parse_tuple: a bare comma makes a tuple.
  ExprPtr ParseTuple(bool no_condition) {
    const int line = Peek().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!IsOp(",")) break;
        Next();
        is_tuple = true;
      }
      if (Peek().type == Token::Type::kBlockEnd || Peek().type == Token::Type::kVarEnd ||
          IsOp(")") || (no_condition && IsName("if")) || IsName("recursive")) {
        break;
      }
      items.push_back(no_condition ? ParseOr() : ParseExpression());
    }
    if (!is_tuple) {
      if (items.empty()) Fail("expected an expression");
      return std::move(items[0]);
    }
    auto e = Make(Expr::Kind::kTuple);
    e->line = line;
    e->children = std::move(items);
    return e;
  }

  ExprPtr ParseExpression() {
    DepthGuard guard(*this);
    ExprPtr body = ParseOr();
    int links = 0;
    while (IsName("if")) {
      Deepen(links);
      Next();
      auto e = Make(Expr::Kind::kCondition);
      ExprPtr test = ParseOr();
      ExprPtr otherwise;
      if (IsName("else")) {
        Next();
        otherwise = ParseExpression();
      }
      e->children.push_back(std::move(body));
      e->children.push_back(std::move(test));
      e->children.push_back(std::move(otherwise));
      body = std::move(e);
    }
    return Undeepen(links, std::move(body));
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    int links = 0;
    while (IsName("or")) {
      Deepen(links);
      Next();
      auto e = Make(Expr::Kind::kOr);
      e->children.push_back(std::move(left));
      e->children.push_back(ParseAnd());
      left = std::move(e);
    }
    return Undeepen(links, std::move(left));
  }

  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    int links = 0;
    while (IsName("and")) {
      Deepen(links);
      Next();
      auto e = Make(Expr::Kind::kAnd);
      e->children.push_back(std::move(left));
      e->children.push_back(ParseNot());
      left = std::move(e);
    }
    return Undeepen(links, std::move(left));
  }

  ExprPtr ParseNot() {
    DepthGuard guard(*this);
    if (IsName("not")) {
      Next();
      auto e = Make(Expr::Kind::kUnary);
      e->name = "not";
      e->children.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    ExprPtr first = ParseMath1();
    ExprPtr e;
    while (true) {
      std::string op;
      if (Peek().type == Token::Type::kOperator &&
          (Peek().value == "==" || Peek().value == "!=" || Peek().value == "<" ||
           Peek().value == ">" || Peek().value == "<=" || Peek().value == ">=")) {
        op = Next().value;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      if (!e) {
        e = Make(Expr::Kind::kCompare);
        e->children.push_back(std::move(first));
      }
      e->ops.push_back(op);
      e->children.push_back(ParseMath1());
    }
    return e ? std::move(e) : std::move(first);
  }

  ExprPtr Binary(std::string op, ExprPtr left, ExprPtr right) {
    auto e = Make(Expr::Kind::kBinary);
    e->name = std::move(op);
    e->children.push_back(std::move(left));
    e->children.push_back(std::move(right));
    return e;
  }

  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    int links = 0;
    while (IsOp("+") || IsOp("-")) {
      Deepen(links);
      std::string op = Next().value;
      left = Binary(op, std::move(left), ParseConcat());
    }
    return Undeepen(links, std::move(left));
  }

  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    int links = 0;
    while (IsOp("~")) {
      Deepen(links);
      Next();
      left = Binary("~", std::move(left), ParseMath2());
    }
    return Undeepen(links, std::move(left));
  }

  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    int links = 0;
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      Deepen(links);
      std::string op = Next().value;
      left = Binary(op, std::move(left), ParsePow());
    }
    return Undeepen(links, std::move(left));
  }

  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    int links = 0;
    while (IsOp("**")) {
      Deepen(links);
      Next();
      left = Binary("**", std::move(left), ParseUnary(true));
    }
    return Undeepen(links, std::move(left));
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      auto e = Make(Expr::Kind::kUnary);
      e->name = Next().value;
      e->children.push_back(ParseUnary(false));
      node = std::move(e);
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Peek();
    if (t.type == Token::Type::kName) {
      const std::string name = Next().value;
      auto e = Make(Expr::Kind::kLiteral);
      if (name == "true" || name == "True") {
        e->literal = Value::Bool(true);
      } else if (name == "false" || name == "False") {
        e->literal = Value::Bool(false);
      } else if (name == "none" || name == "None") {
        e->literal = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = name;
      }
      return e;
    }
    if (t.type == Token::Type::kString) {
      std::string text = Next().value;
      while (Peek().type == Token::Type::kString) text += Next().value;
      auto e = Make(Expr::Kind::kLiteral);
      e->literal = Value::String(std::move(text));
      return e;
    }
    if (t.type == Token::Type::kInt || t.type == Token::Type::kFloat) {
      auto e = Make(Expr::Kind::kLiteral);
      const std::string text = Next().value;
      if (t.type == Token::Type::kInt) {
        errno = 0;
        const long long v = std::strtoll(text.c_str(), nullptr, 10);
        if (errno == ERANGE) Fail("integer literal out of range", JinjaError::Kind::kUnsupported);
        e->literal = Value::Int(v);
      } else {
        e->literal = Value::Float(std::strtod(text.c_str(), nullptr));
      }
      return e;
    }
    if (IsOp("(")) {
      Next();
      if (IsOp(")")) {
        Next();
        return Make(Expr::Kind::kTuple);
      }
      ExprPtr first = ParseExpression();
      if (IsOp(")")) {
        Next();
        return first;
      }
      auto e = Make(Expr::Kind::kTuple);
      e->children.push_back(std::move(first));
      while (IsOp(",")) {
        Next();
        if (IsOp(")")) break;
        e->children.push_back(ParseExpression());
      }
      ExpectOp(")");
      return e;
    }
    if (IsOp("[")) {
      Next();
      auto e = Make(Expr::Kind::kList);
      while (!IsOp("]")) {
        if (!e->children.empty()) {
          ExpectOp(",");
          if (IsOp("]")) break;
        }
        e->children.push_back(ParseExpression());
      }
      Next();
      return e;
    }
    if (IsOp("{")) {
      Next();
      auto e = Make(Expr::Kind::kDict);
      while (!IsOp("}")) {
        if (!e->children.empty()) {
          ExpectOp(",");
          if (IsOp("}")) break;
        }
        e->children.push_back(ParseExpression());
        ExpectOp(":");
        e->children.push_back(ParseExpression());
      }
      Next();
      return e;
    }
    Fail("unexpected '" + (t.value.empty() ? std::string("end of tag") : t.value) + "'");
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    int links = 0;
    while (true) {
      if (IsOp(".") || IsOp("[") || IsOp("(")) Deepen(links);
      if (IsOp(".")) {
        Next();
        auto e = Make(Expr::Kind::kGetAttr);
        if (Peek().type == Token::Type::kName) {
          e->name = Next().value;
        } else if (Peek().type == Token::Type::kInt) {
          e->kind = Expr::Kind::kGetItem;
          auto index = Make(Expr::Kind::kLiteral);
          index->literal = Value::Int(std::strtoll(Next().value.c_str(), nullptr, 10));
          e->children.push_back(std::move(node));
          e->children.push_back(std::move(index));
          node = std::move(e);
          continue;
        } else {
          Fail("expected an attribute name");
        }
        e->children.push_back(std::move(node));
        node = std::move(e);
      } else if (IsOp("[")) {
        Next();
        auto e = Make(Expr::Kind::kGetItem);
        e->children.push_back(std::move(node));
        e->children.push_back(ParseSubscript());
        ExpectOp("]");
        node = std::move(e);
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return Undeepen(links, std::move(node));
      }
    }
  }

  ExprPtr ParseSubscript() {
    ExprPtr start;
    if (!IsOp(":")) {
      start = ParseExpression();
      if (!IsOp(":")) {
        if (IsOp(",")) Fail("tuple subscripts are not supported", JinjaError::Kind::kUnsupported);
        return start;
      }
    }
    auto slice = Make(Expr::Kind::kSlice);
    Next();  // ':'
    ExprPtr stop, step;
    if (!IsOp("]") && !IsOp(":")) stop = ParseExpression();
    if (IsOp(":")) {
      Next();
      if (!IsOp("]")) step = ParseExpression();
    }
    slice->children.push_back(std::move(start));
    slice->children.push_back(std::move(stop));
    slice->children.push_back(std::move(step));
    return slice;
  }

  // `( args )` into e's children (after the existing ones) and keywords.
  void ParseCallArgs(Expr& e) {
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) {
        ExpectOp(",");
        if (IsOp(")")) break;
      }
      first = false;
      if (IsOp("*")) {
        Next();
        e.star_args = ParseExpression();
      } else if (IsOp("**")) {
        Next();
        e.star_kwargs = ParseExpression();
      } else if (Peek().type == Token::Type::kName && IsOp("=", 1)) {
        std::string key = Next().value;
        Next();
        e.keywords.emplace_back(std::move(key), ParseExpression());
      } else {
        if (!e.keywords.empty()) Fail("a positional argument follows a keyword argument");
        e.children.push_back(ParseExpression());
      }
    }
    Next();
  }

  ExprPtr ParseCall(ExprPtr callee) {
    auto e = Make(Expr::Kind::kCall);
    e->children.push_back(std::move(callee));
    ParseCallArgs(*e);
    return e;
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    int links = 0;
    while (true) {
      if (IsOp("|") || IsName("is") || IsOp("(")) Deepen(links);
      if (IsOp("|")) {
        node = ParseFilterChain(std::move(node), true, /*single=*/true);
      } else if (IsName("is")) {
        Next();
        auto e = Make(Expr::Kind::kTest);
        if (IsName("not")) {
          Next();
          e->negated = true;
        }
        e->name = ExpectIdentifier();
        while (IsOp(".")) {
          Next();
          e->name += "." + ExpectIdentifier();
        }
        if (!HasTest(e->name))
          Fail("no test named '" + e->name + "'", JinjaError::Kind::kUnsupported);
        e->children.push_back(std::move(node));
        const Token& t = Peek();
        if (IsOp("(")) {
          ParseCallArgs(*e);
        } else if ((t.type == Token::Type::kName || t.type == Token::Type::kString ||
                    t.type == Token::Type::kInt || t.type == Token::Type::kFloat || IsOp("[") ||
                    IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) Fail("you cannot chain multiple tests with is");
          e->children.push_back(ParsePostfix(ParsePrimary()));
        }
        node = std::move(e);
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return Undeepen(links, std::move(node));
      }
    }
  }

  // `| name(args) | name ...` applied to `node` (null: the body of a filter block or block set).
  ExprPtr ParseFilterChain(ExprPtr node, bool first_has_pipe = true, bool single = false) {
    bool first = true;
    int links = 0;
    while (true) {
      Deepen(links);
      if (!first || first_has_pipe) {
        if (!IsOp("|")) break;
        Next();
      }
      first = false;
      auto e = Make(Expr::Kind::kFilter);
      e->name = ExpectIdentifier();
      while (IsOp(".")) {
        Next();
        e->name += "." + ExpectIdentifier();
      }
      if (!HasFilter(e->name))
        Fail("no filter named '" + e->name + "'", JinjaError::Kind::kUnsupported);
      e->children.push_back(std::move(node));
      if (IsOp("(")) ParseCallArgs(*e);
      node = std::move(e);
      if (single) break;
    }
    return Undeepen(links, std::move(node));
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body Parse(const std::vector<Token>& tokens) { return Parser(tokens).ParseTemplate(); }

}  // namespace tandem::chat::jinja
