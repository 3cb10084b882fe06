// Round-to-nearest quantization of f32 weights into Tandem's layout (quantized_matrix.h): what
// `--quantization int8|int4` does at load, and the baseline GPTQ must beat.
#pragma once

#include <cstdint>

#include "common/quant/quantized_matrix.h"

namespace tandem {

struct RtnOptions {
  QuantType type = QuantType::kInt8;
  // Columns per scale group; 0 means one group per row (per output channel).
  int64_t group_size = 0;
  // Symmetric: zero point 0 (int8, codes in [-127, 127]) or 8 (int4, scale = max|w| / 7.5, GPTQ's
  // convention). Asymmetric: the group's range [min(w, 0), max(w, 0)] over all codes, with an
  // integer zero point (GPTQ's and AWQ's convention).
  bool symmetric = true;
};

// --quantization's defaults: int8 per output channel, symmetric; int4 groups of 128, asymmetric.
RtnOptions DefaultRtnOptions(QuantType type);

// Quantizes w[rows][cols] (row-major, PyTorch Linear layout). Requires type != kNone and, for
// int4, cols % 32 == 0 (Validate's rules); a group size of 0 or above cols means cols.
QuantizedMatrix QuantizeRtn(const float* w, int64_t rows, int64_t cols, const RtnOptions& options);

// The code range of `type`: int8 [-128, 127] (symmetric uses [-127, 127]), int4 [0, 15].
int QuantMinCode(QuantType type);
int QuantMaxCode(QuantType type);

}  // namespace tandem
