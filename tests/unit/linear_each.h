// Backend::LinearEach's promise, checked: every projection's output is the bits its own Linear
// gives it (cpu_backend_test's dense weights, quant_test's quantized ones).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/backend/backend.h"
#include "gtest/gtest.h"

namespace tandem::test_support {

// Runs backend.LinearEach(x, n, projections), then each projection's Linear into a buffer of its
// own, and compares them bit for bit: false (with a failure added) at the first miss. Each
// projection's out must hold n * w->rows floats; it is overwritten first with a NaN pattern, so
// an output LinearEach leaves unwritten is a miss too.
inline bool LinearEachGivesEachLinearsBits(Backend& backend, const float* x, int64_t n,
                                           absl::Span<const Backend::Projection> projections,
                                           const std::string& what) {
  for (const Backend::Projection& p : projections)
    std::fill(p.out, p.out + n * p.w->rows, std::bit_cast<float>(0x7fc0dead));
  backend.LinearEach(x, n, projections);
  for (size_t s = 0; s < projections.size(); ++s) {
    const Backend::Projection& p = projections[s];
    std::vector<float> alone(static_cast<size_t>(n * p.w->rows));
    backend.Linear(x, n, *p.w, p.bias, alone.data());
    for (size_t i = 0; i < alone.size(); ++i) {
      if (std::bit_cast<uint32_t>(alone[i]) != std::bit_cast<uint32_t>(p.out[i])) {
        ADD_FAILURE() << what << ", n=" << n << ": projection " << s << " element " << i << " is "
                      << p.out[i] << " read with the others, " << alone[i] << " alone";
        return false;
      }
    }
  }
  return true;
}

}  // namespace tandem::test_support
