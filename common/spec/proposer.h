// Speculative decoding's proposers: what guesses the next tokens of a sequence for the target model
// to verify in one step (docs/architecture.md, "Speculative decoding"). A proposer is asked once
// per step for every speculating sequence of the batch, so a draft model can propose for all of
// them in one forward pass; the n-gram proposer (ngram_proposer.h) needs no model.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem {

// How a request speculates (SamplingParameters.speculation; the workers' --speculative-* flags).
enum class SpeculationMethod { kOff, kNgram, kDraft };
std::string_view SpeculationMethodName(SpeculationMethod method);
// "off", "ngram" or "draft"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<SpeculationMethod> ParseSpeculationMethod(std::string_view name);

// Most tokens proposed for one sequence in one step (--num-speculative-tokens).
inline constexpr int32_t kMaxSpeculativeTokens = 16;

class SequenceSampler;

// One sequence's part of a proposal.
struct ProposalRequest {
  int64_t seq_id = 0;                // stable while the sequence lives (the engine's request id)
  absl::Span<const int32_t> tokens;  // its prompt and generated tokens so far, in order
  int32_t k = 0;                     // most tokens wanted, in [1, kMaxSpeculativeTokens]
  // A draft model's (DraftModelProposer). The sequence's KV blocks, which hold room for its tokens
  // and k more (the draft's cache is laid out as the target's, block for block), and how many of
  // `tokens` the draft already holds KV for (the caller's count: after a proposal of j tokens the
  // draft holds tokens.size() + j - 1).
  absl::Span<const int32_t> block_table;
  int64_t draft_computed = 0;
  // How the draft picks its tokens: null, its argmax; else this sampler (a fork of the sequence's,
  // with its parameters and history), which draws each token and accepts it.
  SequenceSampler* sampler = nullptr;
};

// What a proposer guesses for one sequence.
struct Proposal {
  std::vector<int32_t> tokens;
  // With a sampler: the distribution each token was drawn from, [tokens.size()][vocab], for
  // verification (common/spec/verify.h); empty when the tokens were chosen without one (argmax,
  // n-gram), which verification treats as all the mass on the token.
  std::vector<float> probs;
  // A draft model's: tokens of the sequence (the request's, then the proposed ones) whose KV the
  // draft holds now. With no tokens proposed (the catch-up did not finish within the call's
  // budget) it still records the progress.
  int64_t draft_computed = 0;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual SpeculationMethod method() const = 0;
  // (*proposals)[i]: at most requests[i].k tokens guessed to follow requests[i].tokens, possibly
  // none (the sequence then decodes one token as usual). INVALID_ARGUMENT for a k outside
  // [1, kMaxSpeculativeTokens] or an empty sequence; nothing is proposed then.
  virtual absl::Status Propose(absl::Span<const ProposalRequest> requests,
                               std::vector<Proposal>* proposals) = 0;
  // The sequence finished, was aborted or preempted: any state kept for it goes.
  virtual void Forget(int64_t /*seq_id*/) {}
};

// The checks every Propose() starts with.
absl::Status ValidateProposalRequests(absl::Span<const ProposalRequest> requests);

}  // namespace tandem
