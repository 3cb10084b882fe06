#include "common/quant/rtn.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/base/thread_pool.h"

namespace tandem {
namespace {

// `scale` as `dtype` stores it, rounded up (never down: a smaller step would push the group's
// extreme weights past the last code), kept finite and positive: 1 for an all-zero group, the
// largest finite F16 for one beyond it.
float RoundScale(float scale, DType dtype) {
  if (dtype == DType::kF16) {
    uint16_t h = F32ToF16(std::min(scale, 65504.f));
    if (F16ToF32(h) < scale && h < 0x7bff) ++h;  // positive: the next code is the next value up
    scale = F16ToF32(h);
  } else if (dtype == DType::kBF16) {
    uint16_t h = F32ToBf16(scale);
    if (Bf16ToF32(h) < scale && h < 0x7f7f) ++h;
    scale = Bf16ToF32(h);
  }
  return scale > 0 && std::isfinite(scale) ? scale : 1.f;
}

}  // namespace

RtnOptions DefaultRtnOptions(QuantType type) {
  RtnOptions o;
  o.type = type;
  o.group_size = type == QuantType::kInt4 ? 128 : 0;
  o.symmetric = type != QuantType::kInt4;
  return o;
}

int QuantMinCode(QuantType type) { return type == QuantType::kInt8 ? -128 : 0; }
int QuantMaxCode(QuantType type) { return type == QuantType::kInt8 ? 127 : 15; }

int QuantGrid::Code(float w) const {
  const float q = std::nearbyint(w / scale) + zero;
  return static_cast<int>(
      std::clamp(q, static_cast<float>(min_code), static_cast<float>(max_code)));
}

QuantGrid RtnGrid(const float* w, int64_t n, int64_t stride, const RtnOptions& o) {
  float lo = 0.f, hi = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, w[i * stride]);
    hi = std::max(hi, w[i * stride]);
  }
  QuantGrid g;
  g.min_code = QuantMinCode(o.type);
  g.max_code = QuantMaxCode(o.type);
  if (o.symmetric) {
    const float amax = std::max(-lo, hi);
    if (o.type == QuantType::kInt8) {
      g.scale = RoundScale(amax / 127.f, o.scale_dtype);
      g.zero = 0.f;
      g.min_code = -127;
    } else {
      g.scale = RoundScale(amax / 7.5f, o.scale_dtype);
      g.zero = 8.f;
    }
    return g;
  }
  const float lo_code = static_cast<float>(g.min_code), hi_code = static_cast<float>(g.max_code);
  float scale = (hi - lo) / (hi_code - lo_code);
  float zero = scale > 0 ? std::nearbyint(-lo / scale) + lo_code : lo_code;
  zero = std::clamp(zero, lo_code, hi_code);
  if (o.zero_above_min_code && zero == lo_code) {
    // All codes at or above the zero: one code below it, the rest for [0, hi].
    zero = lo_code + 1;
    scale = std::max(hi / (hi_code - zero), -lo);
  }
  g.scale = RoundScale(scale, o.scale_dtype);
  g.zero = zero;
  return g;
}

QuantizedMatrix MakeQuantizedMatrixFor(int64_t rows, int64_t cols, const RtnOptions& o) {
  QuantizedMatrix m =
      MakeQuantizedMatrix(o.type, rows, cols, EffectiveGroupSize(o.group_size, cols));
  if (HasZeros(o)) m.zeros.assign(static_cast<size_t>(rows * m.num_groups()), 0.f);
  return m;
}

QuantizedMatrix QuantizeRtn(const float* w, int64_t rows, int64_t cols, const RtnOptions& o) {
  QuantizedMatrix m = MakeQuantizedMatrixFor(rows, cols, o);
  const int64_t group = m.group_size, groups = m.num_groups();
  // Rows are independent: quantized on the default pool (a model's projections take seconds alone).
  ThreadPool::Default().ParallelFor(rows, 16, [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* wr = w + r * cols;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t c0 = g * group, c1 = std::min(cols, c0 + group);
        const QuantGrid grid = RtnGrid(wr + c0, c1 - c0, 1, o);
        m.scales[r * groups + g] = grid.scale;
        if (!m.zeros.empty()) m.zeros[r * groups + g] = grid.zero;
        for (int64_t c = c0; c < c1; ++c) m.SetCode(r, c, grid.Code(wr[c]));
      }
    }
  });
  return m;
}

}  // namespace tandem
