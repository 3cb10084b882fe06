// Runs a Grammar over bytes and tokens.
//
// GrammarAutomaton is the grammar's parser states turned, lazily, into a deterministic automaton
// over bytes: a parser state is the set of stacks a nondeterministic pushdown parser may be in
// (each stack: the byte class to match next, then where to continue after each enclosing rule), and
// a byte moves every stack that can take it. States and their transitions are interned as they are
// met, so a string's body or a repeated structure costs one table lookup a byte once seen. Right
// recursion does not grow stacks (a rule's last symbol continues where the rule would), so loops
// such as a string's characters come back to the same state.
//
// A token mask walks the vocabulary's trie (laid out in preorder) from a state, skipping a subtree
// at the first byte no stack takes; masks are cached per state (a bounded cache). One automaton
// serves every sequence generating to the same grammar; its methods lock, so sequences on several
// threads may share it.
//
// GrammarConstraint is one sequence's position: a state id into a shared automaton.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/sampling/token_constraint.h"
#include "common/structured/grammar.h"
#include "common/structured/token_vocabulary.h"

namespace tandem::structured {

// Token masks asked for, by whether they were computed or found cached, and the time spent in
// AllowedTokens: shared by the automata of one compiler (the engine's metrics).
struct MaskCounters {
  std::atomic<int64_t> computed{0};
  std::atomic<int64_t> cached{0};
  std::atomic<int64_t> nanos{0};
};

class GrammarAutomaton {
 public:
  static constexpr uint32_t kDead = 0;  // the state no byte leaves: nothing matched
  // Caches past these sizes stop growing (masks: cleared; transitions: computed without caching).
  static constexpr size_t kMaxMaskCacheBytes = size_t{64} << 20;
  static constexpr size_t kMaxTransitionTables = 1 << 16;

  GrammarAutomaton(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
                   std::shared_ptr<MaskCounters> counters = nullptr);
  GrammarAutomaton(const GrammarAutomaton&) = delete;
  GrammarAutomaton& operator=(const GrammarAutomaton&) = delete;

  uint32_t start() const { return start_; }
  // The state after `byte` (kDead when no stack takes it).
  uint32_t Next(uint32_t state, uint8_t byte);
  // The state after every byte of `bytes` (kDead at the first that fails).
  uint32_t NextBytes(uint32_t state, std::string_view bytes);
  // Whether the input so far is a complete sentence of the grammar.
  bool IsAccepting(uint32_t state);
  // The tokens whose bytes all move `state` to a live state ([ceil(vocab / 64)] words).
  void AllowedTokens(uint32_t state, std::vector<uint64_t>* bits);

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // Counters for benchmarks and tests.
  struct Stats {
    size_t states = 0;
    size_t stack_nodes = 0;
    int64_t masks_computed = 0;
    int64_t mask_cache_hits = 0;
  };
  Stats stats();

 private:
  // A stack, as a linked list of interned nodes: `pos` indexes grammar elements (the top node's is
  // a kBytes element; an enclosing node's is where to continue when the rule below ends), `parent`
  // the node below (kNoParent at the bottom). Node 0 is the empty stack: the sentence is complete.
  static constexpr uint32_t kNoParent = 0xFFFFFFFFu;
  static constexpr uint32_t kAccepted = 0;
  struct Node {
    uint32_t pos = 0;
    uint32_t parent = kNoParent;
    bool operator==(const Node&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Node& n) {
      return H::combine(std::move(h), n.pos, n.parent);
    }
  };
  uint32_t InternNode(uint32_t pos, uint32_t parent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t InternState(std::vector<uint32_t> nodes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds to `out` the stacks reached from continuing at element `pos` over `parent`.
  void Expand(uint32_t pos, uint32_t parent, int depth, std::vector<uint32_t>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t NextLocked(uint32_t state, uint8_t byte) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AllowedTokens; true when the mask came from the cache.
  bool AllowedTokensLocked(uint32_t state, std::vector<uint64_t>* bits)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Grammar grammar_;
  const std::shared_ptr<const TokenVocabulary> vocabulary_;
  const std::shared_ptr<MaskCounters> counters_;  // may be null
  absl::Mutex mu_;
  std::vector<Node> nodes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Node, uint32_t> node_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<uint32_t>> states_ ABSL_GUARDED_BY(mu_);  // sorted node ids
  absl::flat_hash_map<std::vector<uint32_t>, uint32_t> state_ids_ ABSL_GUARDED_BY(mu_);
  // Per state, its transitions once computed (kUnknown where not yet).
  static constexpr uint32_t kUnknown = 0xFFFFFFFFu;
  std::vector<std::unique_ptr<std::array<uint32_t, 256>>> transitions_ ABSL_GUARDED_BY(mu_);
  size_t transition_tables_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint32_t, std::vector<uint64_t>> masks_ ABSL_GUARDED_BY(mu_);
  size_t mask_cache_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t masks_computed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t mask_cache_hits_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> scratch_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> walk_states_ ABSL_GUARDED_BY(mu_);  // a mask walk's state per depth
  uint32_t start_ = kDead;
};

// One sequence's place in a grammar.
class GrammarConstraint final : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<GrammarAutomaton> automaton)
      : automaton_(std::move(automaton)), state_(automaton_->start()) {}
  void AllowedTokens(std::vector<uint64_t>* bits) override;
  bool CanEnd() const override { return automaton_->IsAccepting(state_); }
  bool Accept(int32_t token) override;
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<GrammarConstraint>(*this);
  }
  uint32_t state() const { return state_; }

 private:
  std::shared_ptr<GrammarAutomaton> automaton_;
  uint32_t state_;
};

}  // namespace tandem::structured
