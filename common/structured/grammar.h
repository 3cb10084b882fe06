// A context-free grammar over bytes: what structured output constrains generation to.
//
// Rules have alternatives; an alternative is a sequence of symbols, each a byte class (a set of
// bytes, matching one byte) or a reference to a rule. Repetition is written with rules
// (GrammarBuilder::Star, Repeat). The grammar works on bytes, not code points, so that a token
// ending inside a UTF-8 character is judged by its bytes like any other; a grammar that wants valid
// UTF-8 spells out the byte sequences (JsonSchemaGrammar does).
//
// Build() refuses grammars the matcher cannot run: a rule without alternatives, a reference to a
// rule never defined, and left recursion (a rule reaching itself before consuming a byte), which
// would never end expanding.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::structured {

// A set of bytes, 256 bits.
struct ByteClass {
  std::array<uint64_t, 4> bits{};

  static ByteClass Of(uint8_t b) { return Range(b, b); }
  static ByteClass Range(uint8_t lo, uint8_t hi);
  ByteClass& Add(uint8_t lo, uint8_t hi);
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool operator==(const ByteClass&) const = default;
};

class Grammar {
 public:
  enum class Kind : uint8_t {
    kBytes,  // matches one byte of classes()[index]
    kRule,   // expands rule `index`
    kEnd,    // ends an alternative
  };
  struct Element {
    Kind kind = Kind::kEnd;
    uint32_t index = 0;
  };

  // Every alternative of every rule, each ended by a kEnd element.
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<ByteClass>& classes() const { return classes_; }
  // Per rule, the offsets in elements() where its alternatives start.
  const std::vector<std::vector<uint32_t>>& rule_alternatives() const { return alternatives_; }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }
  uint32_t root() const { return root_; }
  size_t num_rules() const { return names_.size(); }

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;
  std::vector<ByteClass> classes_;
  std::vector<std::vector<uint32_t>> alternatives_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
};

class GrammarBuilder {
 public:
  // One symbol of an alternative.
  struct Symbol {
    bool is_rule = false;
    uint32_t rule = 0;
    ByteClass bytes;
  };
  static Symbol Bytes(ByteClass c) { return Symbol{false, 0, c}; }
  static Symbol Byte(uint8_t b) { return Bytes(ByteClass::Of(b)); }
  static Symbol Ref(uint32_t rule) { return Symbol{true, rule, {}}; }
  using Sequence = std::vector<Symbol>;

  // A new rule with no alternatives yet (define it later with AddAlternative: rules may refer to
  // each other in any order).
  uint32_t NewRule(std::string name);
  void AddAlternative(uint32_t rule, Sequence alternative);
  // Appends `literal`'s bytes to `seq`.
  static void AppendLiteral(std::string_view literal, Sequence* seq);
  static Sequence Literal(std::string_view literal);
  // A rule matching exactly `literal`.
  uint32_t LiteralRule(std::string name, std::string_view literal);
  // A rule matching any one of `alternatives`.
  uint32_t Choice(std::string name, std::vector<Sequence> alternatives);
  // A rule matching `item` zero or more times.
  uint32_t Star(std::string name, Symbol item);
  // A rule matching `item` between min and max times (max < 0: no upper bound). Bounded repeats
  // cost one rule per optional item; at most kMaxRepeat of them.
  static constexpr int64_t kMaxRepeat = 4096;
  absl::StatusOr<uint32_t> Repeat(std::string name, Symbol item, int64_t min, int64_t max);
  // `item` (separator item)* between min and max items, for arrays.
  absl::StatusOr<uint32_t> SeparatedRepeat(std::string name, Symbol item, Sequence separator,
                                           int64_t min, int64_t max);

  size_t num_rules() const { return names_.size(); }
  absl::StatusOr<Grammar> Build(uint32_t root) const;

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<Sequence>> rules_;
};

}  // namespace tandem::structured
