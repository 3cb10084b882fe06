#include "common/structured/grammar.h"

#include <functional>

#include "absl/strings/str_cat.h"

namespace tandem::structured {

ByteClass ByteClass::Range(uint8_t lo, uint8_t hi) {
  ByteClass c;
  c.Add(lo, hi);
  return c;
}

ByteClass& ByteClass::Add(uint8_t lo, uint8_t hi) {
  for (int b = lo; b <= hi; ++b) bits[b >> 6] |= uint64_t{1} << (b & 63);
  return *this;
}

uint32_t GrammarBuilder::NewRule(std::string name) {
  names_.push_back(std::move(name));
  rules_.emplace_back();
  return static_cast<uint32_t>(names_.size() - 1);
}

void GrammarBuilder::AddAlternative(uint32_t rule, Sequence alternative) {
  rules_[rule].push_back(std::move(alternative));
}

void GrammarBuilder::AppendLiteral(std::string_view literal, Sequence* seq) {
  for (char c : literal) seq->push_back(Byte(static_cast<uint8_t>(c)));
}

GrammarBuilder::Sequence GrammarBuilder::Literal(std::string_view literal) {
  Sequence seq;
  AppendLiteral(literal, &seq);
  return seq;
}

uint32_t GrammarBuilder::LiteralRule(std::string name, std::string_view literal) {
  const uint32_t r = NewRule(std::move(name));
  AddAlternative(r, Literal(literal));
  return r;
}

uint32_t GrammarBuilder::Choice(std::string name, std::vector<Sequence> alternatives) {
  const uint32_t r = NewRule(std::move(name));
  for (Sequence& alt : alternatives) AddAlternative(r, std::move(alt));
  return r;
}

uint32_t GrammarBuilder::Star(std::string name, Symbol item) {
  const uint32_t r = NewRule(std::move(name));
  AddAlternative(r, {item, Ref(r)});
  AddAlternative(r, {});
  return r;
}

absl::StatusOr<uint32_t> GrammarBuilder::Repeat(std::string name, Symbol item, int64_t min,
                                                int64_t max) {
  if (min < 0 || (max >= 0 && max < min)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": a repeat needs 0 <= min <= max, got [", min, ", ", max, "]"));
  }
  if (min > kMaxRepeat || (max >= 0 && max - min > kMaxRepeat)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": repeat bounds [", min, ", ", max,
                                                   "] exceed the ", kMaxRepeat,
                                                   " a grammar may spell out"));
  }
  Sequence seq(static_cast<size_t>(min), item);
  if (max < 0) {
    seq.push_back(Ref(Star(name + "*", item)));
  } else if (max > min) {
    // tail_k: up to k more items, built from the shortest.
    uint32_t tail = NewRule(absl::StrCat(name, "?1"));
    AddAlternative(tail, {item});
    AddAlternative(tail, {});
    for (int64_t k = 2; k <= max - min; ++k) {
      const uint32_t longer = NewRule(absl::StrCat(name, "?", k));
      AddAlternative(longer, {item, Ref(tail)});
      AddAlternative(longer, {});
      tail = longer;
    }
    seq.push_back(Ref(tail));
  }
  const uint32_t r = NewRule(std::move(name));
  AddAlternative(r, std::move(seq));
  return r;
}

absl::StatusOr<uint32_t> GrammarBuilder::SeparatedRepeat(std::string name, Symbol item,
                                                         Sequence separator, int64_t min,
                                                         int64_t max) {
  if (min < 0 || (max >= 0 && max < min)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": a repeat needs 0 <= min <= max, got [", min, ", ", max, "]"));
  }
  const uint32_t r = NewRule(name);
  if (max != 0) {
    Sequence more_item = std::move(separator);
    more_item.push_back(item);
    const uint32_t more = NewRule(name + ",item");
    AddAlternative(more, std::move(more_item));
    const int64_t rest_min = min > 0 ? min - 1 : 0;
    const int64_t rest_max = max < 0 ? -1 : max - 1;
    auto rest = Repeat(name + ",rest", Ref(more), rest_min, rest_max);
    if (!rest.ok()) return rest.status();
    AddAlternative(r, {item, Ref(*rest)});
  }
  if (min == 0) AddAlternative(r, {});
  return r;
}

absl::StatusOr<Grammar> GrammarBuilder::Build(uint32_t root) const {
  const size_t n = rules_.size();
  if (root >= n) return absl::InvalidArgumentError("grammar: the root rule does not exist");
  for (size_t r = 0; r < n; ++r) {
    if (rules_[r].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar: rule '", names_[r], "' has no alternatives"));
    }
    for (const Sequence& alt : rules_[r]) {
      for (const Symbol& s : alt) {
        if (s.is_rule && s.rule >= n) {
          return absl::InvalidArgumentError(
              absl::StrCat("grammar: rule '", names_[r], "' refers to an undefined rule"));
        }
      }
    }
  }
  // Nullable rules (can match nothing), to a fixed point.
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& alt : rules_[r]) {
        bool all = true;
        for (const Symbol& s : alt) all = all && s.is_rule && nullable[s.rule];
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  // Left recursion: a cycle among "expands before consuming a byte" edges.
  std::vector<std::vector<uint32_t>> left(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& alt : rules_[r]) {
      for (const Symbol& s : alt) {
        if (!s.is_rule) break;
        left[r].push_back(s.rule);
        if (!nullable[s.rule]) break;
      }
    }
  }
  std::vector<uint8_t> color(n, 0);  // 0 unseen, 1 on the path, 2 done
  std::string cycle_at;
  std::function<bool(uint32_t)> visit = [&](uint32_t r) {
    color[r] = 1;
    for (uint32_t next : left[r]) {
      if (color[next] == 1) {
        cycle_at = names_[next];
        return false;
      }
      if (color[next] == 0 && !visit(next)) return false;
    }
    color[r] = 2;
    return true;
  };
  for (uint32_t r = 0; r < n; ++r) {
    if (color[r] == 0 && !visit(r)) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar: rule '", cycle_at, "' is left-recursive"));
    }
  }

  Grammar g;
  g.names_ = names_;
  g.root_ = root;
  g.alternatives_.resize(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& alt : rules_[r]) {
      g.alternatives_[r].push_back(static_cast<uint32_t>(g.elements_.size()));
      for (const Symbol& s : alt) {
        if (s.is_rule) {
          g.elements_.push_back({Grammar::Kind::kRule, s.rule});
        } else {
          uint32_t index = 0;
          while (index < g.classes_.size() && !(g.classes_[index] == s.bytes)) ++index;
          if (index == g.classes_.size()) g.classes_.push_back(s.bytes);
          g.elements_.push_back({Grammar::Kind::kBytes, index});
        }
      }
      g.elements_.push_back({Grammar::Kind::kEnd, 0});
    }
  }
  return g;
}

}  // namespace tandem::structured
