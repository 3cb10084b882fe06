// A request's StructuredOutput → its grammar, and that grammar's automaton over a model's tokens.
//
// The grammars of recent requests are kept (least recently used out, `capacity` of them), each
// with its automaton, so a schema many requests share is compiled once and its token masks are
// computed once per parser state for all of them.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/sampling/sampling_params.h"
#include "common/structured/grammar.h"
#include "common/structured/grammar_matcher.h"
#include "common/structured/token_vocabulary.h"

namespace tandem::structured {

// The grammar of `spec` (kind other than kNone). INVALID_ARGUMENT, prefixed
// "structured_output: ", for a schema that is not JSON or that the grammar cannot express.
absl::StatusOr<Grammar> CompileStructuredOutput(const StructuredOutput& spec);

class StructuredOutputCompiler {
 public:
  explicit StructuredOutputCompiler(std::shared_ptr<const TokenVocabulary> vocabulary,
                                    size_t capacity = 64);
  // The automaton of `spec`, compiled or from the cache. Thread-safe.
  absl::StatusOr<std::shared_ptr<GrammarAutomaton>> Automaton(const StructuredOutput& spec);
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // Every mask its automata were asked for (evicted automata's included).
  const MaskCounters& counters() const { return *counters_; }

 private:
  const std::shared_ptr<const TokenVocabulary> vocabulary_;
  const size_t capacity_;
  const std::shared_ptr<MaskCounters> counters_ = std::make_shared<MaskCounters>();
  absl::Mutex mu_;
  // Most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<GrammarAutomaton>>> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, decltype(lru_)::iterator> by_key_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::structured
