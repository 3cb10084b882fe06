#include "common/engine/speculation.h"

#include <algorithm>
#include <cmath>

namespace tandem {

void SpeculationPolicy::BeginStep(int64_t decoding) {
  rows_left_ = std::max<int64_t>(0, options_.step_rows - decoding);
}

int32_t SpeculationPolicy::Budget(SequenceSpeculation* seq, int32_t wanted,
                                  SpecDecision* decision) {
  *decision = SpecDecision::kFull;
  if (wanted <= 0) return 0;
  if (!options_.adaptive) return wanted;
  int32_t k = wanted;
  if (seq->paused_steps > 0) {
    seq->probe = --seq->paused_steps == 0;
    *decision = SpecDecision::kOffAcceptance;
    return 0;
  }
  const double a = seq->acceptance;
  if (seq->probe) {  // the pause is over: one token, to see whether acceptance came back
    seq->probe = false;
    k = 1;
    if (k < wanted) *decision = SpecDecision::kShrunkAcceptance;
  } else if (a < kMinGain) {
    seq->paused_steps = kPauseSteps;
    *decision = SpecDecision::kOffAcceptance;
    return 0;
  } else if (a < 1.0) {
    const int32_t by_gain = static_cast<int32_t>(std::floor(std::log(kMinGain) / std::log(a)));
    if (by_gain < k) {
      k = std::max(1, by_gain);
      *decision = SpecDecision::kShrunkAcceptance;
    }
  }
  if (k > rows_left_) {
    k = static_cast<int32_t>(rows_left_);
    *decision = k == 0 ? SpecDecision::kOffBatch : SpecDecision::kShrunkBatch;
  }
  rows_left_ -= k;
  return k;
}

void SpeculationPolicy::Record(SequenceSpeculation* seq, int32_t proposed, int32_t accepted) {
  if (proposed <= 0) return;
  // Each proposed token is a trial kept with probability a, until the first refusal: `accepted`
  // successes in accepted + 1 trials, or in `accepted` when none was refused.
  const int32_t trials = accepted + (accepted < proposed ? 1 : 0);
  const double share = static_cast<double>(accepted) / trials;
  seq->acceptance = (1.0 - kAverageWeight) * seq->acceptance + kAverageWeight * share;
}

}  // namespace tandem
