// Prompt lookup (n-gram) speculation: no model. For a sequence whose last n tokens occurred earlier
// in it (its prompt or its output), the tokens that followed that earlier occurrence are proposed:
// text that repeats (code, quotations, a document being edited, the KJV's refrains) is guessed
// from itself. vLLM's `ngram` method with prompt_lookup_min/max; here the longest n from max_n down
// to min_n that matches wins, and among its occurrences the most recent.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/proposer.h"

namespace tandem {

class NgramProposer final : public Proposer {
 public:
  struct Options {
    int32_t min_n = 1;  // shortest suffix matched (--ngram-min)
    int32_t max_n = 4;  // longest suffix matched (--ngram-max)
  };
  // INVALID_ARGUMENT unless 1 <= min_n <= max_n <= kMaxNgram.
  static absl::StatusOr<std::unique_ptr<NgramProposer>> Create(const Options& options);
  static constexpr int32_t kMaxNgram = 32;

  SpeculationMethod method() const override { return SpeculationMethod::kNgram; }
  absl::Status Propose(absl::Span<const ProposalRequest> requests,
                       std::vector<Proposal>* proposals) override;

  // One sequence's proposal (what Propose gives it): the continuation, at most k tokens, of the
  // most recent earlier occurrence of the longest suffix of `tokens` of min_n..max_n tokens; empty
  // when none occurs. The continuation may run into the suffix itself (a repeating pattern).
  std::vector<int32_t> ProposeOne(absl::Span<const int32_t> tokens, int32_t k) const;

 private:
  explicit NgramProposer(const Options& options) : options_(options) {}
  Options options_;
};

}  // namespace tandem
