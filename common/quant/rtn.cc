#include "common/quant/rtn.h"

#include <algorithm>
#include <cmath>

#include "common/base/thread_pool.h"

namespace tandem {

RtnOptions DefaultRtnOptions(QuantType type) {
  RtnOptions o;
  o.type = type;
  o.group_size = type == QuantType::kInt4 ? 128 : 0;
  o.symmetric = type != QuantType::kInt4;
  return o;
}

int QuantMinCode(QuantType type) { return type == QuantType::kInt8 ? -128 : 0; }
int QuantMaxCode(QuantType type) { return type == QuantType::kInt8 ? 127 : 15; }

QuantizedMatrix QuantizeRtn(const float* w, int64_t rows, int64_t cols, const RtnOptions& o) {
  const int64_t group = o.group_size <= 0 || o.group_size > cols ? cols : o.group_size;
  QuantizedMatrix m = MakeQuantizedMatrix(o.type, rows, cols, group);
  const int64_t groups = m.num_groups();
  // Codes are offsets from the zero point; int8 keeps them signed (zero 0 when symmetric).
  const int lo_code = QuantMinCode(o.type), hi_code = QuantMaxCode(o.type);
  const bool need_zeros = !(o.symmetric && o.type == QuantType::kInt8);
  if (need_zeros) m.zeros.assign(static_cast<size_t>(rows * groups), 0.f);
  // Rounding ties to even, as torch.round (GPTQ's and AWQ's quantizers) does. Rows are
  // independent: quantized on the default pool (a model's projections take seconds alone).
  ThreadPool::Default().ParallelFor(rows, 16, [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* wr = w + r * cols;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t c0 = g * group, c1 = std::min(cols, c0 + group);
        float lo = 0.f, hi = 0.f;
        for (int64_t c = c0; c < c1; ++c) {
          lo = std::min(lo, wr[c]);
          hi = std::max(hi, wr[c]);
        }
        float scale, zero;
        int qmin = lo_code, qmax = hi_code;
        if (o.symmetric) {
          const float amax = std::max(-lo, hi);
          if (o.type == QuantType::kInt8) {
            scale = amax / 127.f;
            zero = 0.f;
            qmin = -127;
          } else {
            scale = amax / 7.5f;
            zero = 8.f;
          }
        } else {
          scale = (hi - lo) / static_cast<float>(hi_code - lo_code);
          zero = scale > 0 ? std::nearbyint(-lo / scale) + static_cast<float>(lo_code) : 0.f;
          zero = std::clamp(zero, static_cast<float>(lo_code), static_cast<float>(hi_code));
        }
        if (!(scale > 0) || !std::isfinite(scale)) scale = 1.f;  // an all-zero group
        m.scales[r * groups + g] = scale;
        if (need_zeros) m.zeros[r * groups + g] = zero;
        for (int64_t c = c0; c < c1; ++c) {
          const float q = std::nearbyint(wr[c] / scale) + zero;
          m.SetCode(
              r, c,
              static_cast<int>(std::clamp(q, static_cast<float>(qmin), static_cast<float>(qmax))));
        }
      }
    }
  });
  return m;
}

}  // namespace tandem
