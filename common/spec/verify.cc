#include "common/spec/verify.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// The index where `u` (in [0, 1)) falls in the cumulative sums of weight(0..n) / total; the last
// positive weight when rounding leaves u past the end. Weights are computed on the fly, so a draw
// over a whole vocabulary needs no buffer of it.
template <typename Weight>
int32_t DrawIndex(size_t n, const Weight& weight, double total, double u) {
  const double target = u * total;
  double sum = 0.0;
  int32_t last = 0;
  for (size_t i = 0; i < n; ++i) {
    const double w = weight(i);
    if (w <= 0.0) continue;
    sum += w;
    last = static_cast<int32_t>(i);
    if (target < sum) return last;
  }
  return last;
}

template <typename Weight>
double Total(size_t n, const Weight& weight) {
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += weight(i);
  return total;
}

}  // namespace

TokenVerdict VerifySampledToken(int32_t x, absl::Span<const float> draft,
                                absl::Span<const float> target,
                                const std::function<double()>& uniform) {
  const size_t vocab = target.size();
  const float* p = target.data();
  const float* q = draft.empty() ? nullptr : draft.data();
  const double px = p[x], qx = q != nullptr ? q[x] : 1.0;
  // Kept with probability min(1, p(x) / q(x)): u < p(x) / q(x), as u · q(x) < p(x).
  if (uniform() * qx < px) return {true, x};
  // Refused: the residual max(0, p - q), which holds the mass p has beyond q.
  auto residual = [&](size_t y) {
    const double qy = q != nullptr ? q[y] : (static_cast<int32_t>(y) == x ? 1.0 : 0.0);
    return std::max(0.0, static_cast<double>(p[y]) - qy);
  };
  const double total = Total(vocab, residual);
  if (!(total > 0.0)) return {false, DrawFromDistribution(target, uniform())};  // p equals q
  return {false, DrawIndex(vocab, residual, total, uniform())};
}

int32_t DrawFromDistribution(absl::Span<const float> probs, double u) {
  auto weight = [&](size_t y) { return static_cast<double>(std::max(0.0f, probs[y])); };
  return DrawIndex(probs.size(), weight, Total(probs.size(), weight), u);
}

absl::StatusOr<Verdict> VerifyGreedy(absl::Span<const int32_t> proposed,
                                     absl::Span<const int32_t> target_argmax) {
  if (target_argmax.size() != proposed.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat(target_argmax.size(), " target choices for ",
                                                   proposed.size(), " proposed tokens (want ",
                                                   proposed.size() + 1, ")"));
  }
  Verdict v;
  while (v.accepted < static_cast<int32_t>(proposed.size()) &&
         proposed[v.accepted] == target_argmax[v.accepted]) {
    ++v.accepted;
  }
  v.next_token = target_argmax[v.accepted];
  return v;
}

absl::StatusOr<Verdict> VerifySampled(absl::Span<const int32_t> proposed,
                                      absl::Span<const float> draft, absl::Span<const float> target,
                                      int64_t vocab, const std::function<double()>& uniform) {
  const int64_t k = static_cast<int64_t>(proposed.size());
  if (vocab <= 0 || static_cast<int64_t>(target.size()) != (k + 1) * vocab ||
      (!draft.empty() && static_cast<int64_t>(draft.size()) != k * vocab)) {
    return absl::InvalidArgumentError(
        absl::StrCat("verification rows: ", target.size(), " target and ", draft.size(),
                     " draft probabilities for ", k, " proposed tokens over ", vocab, " tokens"));
  }
  for (int32_t t : proposed) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("proposed token ", t, " outside the vocabulary of ", vocab));
    }
  }
  Verdict v;
  for (int64_t i = 0; i < k; ++i) {
    const TokenVerdict t = VerifySampledToken(
        proposed[i], draft.empty() ? absl::Span<const float>() : draft.subspan(i * vocab, vocab),
        target.subspan(i * vocab, vocab), uniform);
    if (!t.accepted) {
      v.next_token = t.token;
      return v;
    }
    ++v.accepted;
  }
  v.next_token = DrawFromDistribution(target.subspan(k * vocab, vocab), uniform());
  return v;
}

}  // namespace tandem
