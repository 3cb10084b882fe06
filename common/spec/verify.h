// Verifying proposed tokens against the target model (speculative decoding): the k + 1 logits rows
// of one sequence's verification step give, for each proposed token, the target's distribution
// after the tokens before it. These functions decide how many proposed tokens are kept and which
// token the target adds after them, so that the output is exactly what decoding the target alone
// gives: token for token when greedy, in distribution when sampled.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem {

struct Verdict {
  int32_t accepted = 0;    // proposed tokens kept: the first `accepted` of them
  int32_t next_token = 0;  // then the target's own token (the correction, or the bonus after all k)
};

// Greedy: target_argmax[i] (k + 1 of them) is the target's choice after the sequence and
// proposed[0..i). The longest prefix of proposed that equals those choices is kept, and the next
// choice follows it. INVALID_ARGUMENT unless there are proposed.size() + 1 choices.
absl::StatusOr<Verdict> VerifyGreedy(absl::Span<const int32_t> proposed,
                                     absl::Span<const int32_t> target_argmax);

// Sampled (rejection sampling: Leviathan et al. 2023, Chen et al. 2023). target[i] ([k + 1]
// [vocab], rows of probabilities after every sampling parameter) is the target's distribution
// after proposed[0..i); draft[i] ([k][vocab]) the distribution proposed[i] was drawn from, or, with
// `draft` empty, a proposal made without one (n-gram: all its mass on the proposed token). Token
// proposed[i] is kept with probability min(1, target[i](x) / draft[i](x)); at the first refusal the
// next token is drawn from max(0, target[i] - draft[i]) renormalised, and after k acceptances from
// target[k]. The tokens come out distributed exactly as the target's own samples would.
// `uniform` gives numbers in [0, 1), one per decision and one per draw. INVALID_ARGUMENT for rows
// of the wrong count or size, or a proposed token outside the vocabulary.
absl::StatusOr<Verdict> VerifySampled(absl::Span<const int32_t> proposed,
                                      absl::Span<const float> draft, absl::Span<const float> target,
                                      int64_t vocab, const std::function<double()>& uniform);

// One step of VerifySampled, for a caller whose target rows depend on what was kept before (a
// sequence's penalties count the kept tokens): proposed token `x` against the target's row
// `target` and the draft's row `draft` (empty: the point mass on x), both [vocab] probabilities
// with x in range. Kept: {true, x}; refused: {false, a draw from the residual}.
struct TokenVerdict {
  bool accepted = false;
  int32_t token = 0;
};
TokenVerdict VerifySampledToken(int32_t x, absl::Span<const float> draft,
                                absl::Span<const float> target,
                                const std::function<double()>& uniform);
// A token drawn from probabilities `probs` with uniform `u` (the bonus after every proposed token
// is kept): the first id whose running sum exceeds u × the sum.
int32_t DrawFromDistribution(absl::Span<const float> probs, double u);

}  // namespace tandem
