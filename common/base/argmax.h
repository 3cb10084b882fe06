// Greedy decoding's choice over one row of logits, shared by the sampler and the backends (which
// compute it where the logits are, so a greedy step copies one id per row instead of the row).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace tandem {

// The lowest id among the largest logits; NaN never wins; 0 when nothing beats -inf.
inline int32_t ArgmaxRow(const float* logits, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // kLanes independent running maxima break the compare-and-select dependency chain (and let the
  // compiler use packed max); a second pass finds the first id holding the maximum.
  constexpr int kLanes = 8;
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, kNegInf);
  const int64_t full = n - n % kLanes;
  for (int64_t i = 0; i < full; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] = logits[i + j] > lanes[j] ? logits[i + j] : lanes[j];
  }
  for (int64_t i = full; i < n; ++i) lanes[0] = logits[i] > lanes[0] ? logits[i] : lanes[0];
  const float max_logit = *std::max_element(lanes, lanes + kLanes);
  if (max_logit == kNegInf) return 0;
  int64_t first = 0;
  while (logits[first] != max_logit) ++first;
  return static_cast<int32_t>(first);
}

}  // namespace tandem
