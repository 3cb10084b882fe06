#include "common/structured/structured_output.h"

#include "absl/strings/str_cat.h"
#include "common/structured/json_schema.h"

namespace tandem::structured {

absl::StatusOr<Grammar> CompileStructuredOutput(const StructuredOutput& spec) {
  switch (spec.kind) {
    case StructuredOutput::Kind::kJsonObject: return AnyJsonObjectGrammar();
    case StructuredOutput::Kind::kJsonSchema: {
      absl::StatusOr<Grammar> g = JsonSchemaGrammarFromText(spec.json_schema);
      if (!g.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("structured_output: ", g.status().message()));
      }
      return g;
    }
    case StructuredOutput::Kind::kNone: break;
  }
  return absl::InvalidArgumentError("structured_output: no kind set");
}

StructuredOutputCompiler::StructuredOutputCompiler(
    std::shared_ptr<const TokenVocabulary> vocabulary, size_t capacity)
    : vocabulary_(std::move(vocabulary)), capacity_(capacity == 0 ? 1 : capacity) {}

absl::StatusOr<std::shared_ptr<GrammarAutomaton>> StructuredOutputCompiler::Automaton(
    const StructuredOutput& spec) {
  const std::string key = spec.kind == StructuredOutput::Kind::kJsonObject
                              ? std::string("object")
                              : absl::StrCat("schema:", spec.json_schema);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = by_key_.find(key); it != by_key_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  absl::StatusOr<Grammar> grammar = CompileStructuredOutput(spec);
  if (!grammar.ok()) return grammar.status();
  auto automaton = std::make_shared<GrammarAutomaton>(*std::move(grammar), vocabulary_, counters_);
  absl::MutexLock lock(&mu_);
  if (auto it = by_key_.find(key); it != by_key_.end()) return it->second->second;
  lru_.emplace_front(key, automaton);
  by_key_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    by_key_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return automaton;
}

}  // namespace tandem::structured
