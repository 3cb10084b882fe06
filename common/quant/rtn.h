// Round-to-nearest quantization of f32 weights into Tandem's layout (quantized_matrix.h): what
// `--quantization int8|int4` does at load, and the baseline GPTQ must beat. The grid of a group
// (its scale and zero point) is shared with GPTQ (gptq.h), which rounds onto the same grids.
#pragma once

#include <cstdint>

#include "common/quant/quantized_matrix.h"
#include "common/tensor/dtype.h"

namespace tandem {

struct RtnOptions {
  QuantType type = QuantType::kInt8;
  // Columns per scale group; 0 means one group per row (per output channel).
  int64_t group_size = 0;
  // Symmetric: zero point 0 (int8, codes in [-127, 127]) or 8 (int4, scale = max|w| / 7.5, GPTQ's
  // convention). Asymmetric: the group's range [min(w, 0), max(w, 0)] over all codes, with an
  // integer zero point (GPTQ's and AWQ's convention).
  bool symmetric = true;
  // The dtype a checkpoint stores scales in (GPTQ: F16; compressed-tensors: the model's dtype):
  // scales are rounded up to it before codes are chosen, so codes fit the scale that is stored.
  DType scale_dtype = DType::kF32;
  // Asymmetric only: keep the zero point above the lowest code (the original GPTQ format stores
  // zero − 1, so a zero at the lowest code cannot be written); the scale widens to fit.
  bool zero_above_min_code = false;
};

// --quantization's defaults: int8 per output channel, symmetric; int4 groups of 128, asymmetric.
RtnOptions DefaultRtnOptions(QuantType type);

// The code range of `type`: int8 [-128, 127] (symmetric uses [-127, 127]), int4 [0, 15].
int QuantMinCode(QuantType type);
int QuantMaxCode(QuantType type);

// One group's grid: w ≈ (q − zero) · scale with q an integer code in [min_code, max_code].
struct QuantGrid {
  float scale = 1.f;
  float zero = 0.f;
  int min_code = 0;
  int max_code = 0;
  // The code nearest w on this grid (ties to even, as torch.round rounds), clamped to the range.
  int Code(float w) const;
  float Value(int code) const { return (static_cast<float>(code) - zero) * scale; }
};

// The grid RTN gives the n values w[0], w[stride], ... w[(n − 1)·stride].
QuantGrid RtnGrid(const float* w, int64_t n, int64_t stride, const RtnOptions& options);

// Quantizes w[rows][cols] (row-major, PyTorch Linear layout). Requires type != kNone and, for
// int4, cols % 32 == 0 (Validate's rules); a group size of 0 or above cols means cols.
QuantizedMatrix QuantizeRtn(const float* w, int64_t rows, int64_t cols, const RtnOptions& options);

// The group size QuantizeRtn and QuantizeGptq use: `group_size`, or cols for 0 or above cols.
inline int64_t EffectiveGroupSize(int64_t group_size, int64_t cols) {
  return group_size <= 0 || group_size > cols ? cols : group_size;
}

// A matrix of `options`' type, group size and zero points (all codes 0), ready to be filled.
QuantizedMatrix MakeQuantizedMatrixFor(int64_t rows, int64_t cols, const RtnOptions& options);

// Whether matrices quantized with `options` carry zero points (all but symmetric int8).
inline bool HasZeros(const RtnOptions& o) { return !(o.symmetric && o.type == QuantType::kInt8); }

}  // namespace tandem
