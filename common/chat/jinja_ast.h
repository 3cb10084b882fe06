// The parsed form of a Jinja template: expressions and statements as jinja2's parser builds them.
#ifndef TANDEM_COMMON_CHAT_JINJA_AST_H_
#define TANDEM_COMMON_CHAT_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/chat/jinja_value.h"

namespace tandem::chat::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // children
    kTuple,      // children
    kDict,       // children: key, value, key, value, ...
    kGetAttr,    // children[0].name
    kGetItem,    // children[0][children[1]]
    kSlice,      // children[0..2]: start, stop, step (each may be null); only inside kGetItem
    kCall,       // children[0](children[1..], keywords)
    kFilter,     // children[0] | name(children[1..], keywords); children[0] null in a filter block
    kTest,       // children[0] is [not] name(children[1..], keywords)
    kUnary,      // name ("-", "+", "not") children[0]
    kBinary,     // children[0] name children[1]: + - * / // % ** ~
    kCompare,    // children[0] ops[0] children[1] ops[1] children[2] ... (Python chaining)
    kAnd,        // children[0] and children[1]
    kOr,         // children[0] or children[1]
    kCondition,  // children[0] if children[1] else children[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
  ExprPtr star_args;    // *args in a call
  ExprPtr star_kwargs;  // **kwargs in a call
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

// An assignment target: `name`, or `ns.attribute` (a namespace attribute).
struct Target {
  std::string name;
  std::string attribute;
};

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conditions[i] -> bodies[i]; else_body
    kFor,          // for targets in expr [if condition] body else else_body
    kSet,          // targets = expr
    kSetBlock,     // {% set targets[0] [| filter] %} body {% endset %}
    kMacro,        // name(params = defaults) body
    kFilterBlock,  // {% filter expr %} body
    kWith,         // with targets[i] = values[i]: body
    kBreak,
    kContinue,
    kScope,  // {% generation %} body: rendered as is
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;                // kFor's `if`
  ExprPtr filter;                   // kSetBlock's filter chain, kFilterBlock's filter
  std::vector<ExprPtr> conditions;  // kIf
  std::vector<Body> bodies;         // kIf
  Body body;
  Body else_body;
  std::vector<Target> targets;
  bool unpack = false;              // kFor/kSet: targets is a tuple
  std::vector<ExprPtr> values;      // kWith
  std::string name;                 // kMacro
  std::vector<std::string> params;  // kMacro
  std::vector<ExprPtr> defaults;    // kMacro: one per param, null where none
};

}  // namespace tandem::chat::jinja

#endif  // TANDEM_COMMON_CHAT_JINJA_AST_H_
