// GPTQ (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization for Generative
// Pre-trained Transformers"): quantizes a Linear's weights one input column at a time onto RTN's
// grids (rtn.h), and after each column spreads its rounding error over the columns not yet
// quantized so that the layer's output on calibration inputs, not its weights, stays close:
//
//   minimise ‖X Wᵀ − X Qᵀ‖² over codes Q, where H = Xᵀ X (X: calibration inputs [tokens][cols])
//
// with the inverse Hessian's upper Cholesky factor U (H⁻¹ = Uᵀ U): after column i is rounded,
// err = (w_i − q_i) / U[i][i] and w_j −= err · U[i][j] for j > i. Columns are done in blocks,
// the rest of the matrix updated once a block (one GEMM). Act-order takes columns in decreasing
// H[i][i] (the inputs with the most energy first); groups are then contiguous in that order, which
// is QuantizedMatrix's perm. A dead input (H[i][i] = 0) gets weight 0.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/quant/quantized_matrix.h"
#include "common/quant/rtn.h"

namespace tandem {

struct GptqOptions {
  RtnOptions grid;         // type, group size, symmetry, scale dtype: the grids codes round onto
  bool act_order = false;  // columns in decreasing H[i][i] (GPTQ's desc_act)
  double damp = 0.01;      // added to H's diagonal, as a fraction of its mean
  int64_t block_size = 128;
};

// Accumulates Xᵀ X of calibration inputs into a symmetric [cols][cols] matrix, in f32 (as GPTQ's
// implementations keep it): cols² × 4 bytes.
class HessianAccumulator {
 public:
  explicit HessianAccumulator(int64_t cols);
  // Adds the n rows of x [n][cols].
  void Add(const float* x, int64_t n);
  int64_t cols() const { return cols_; }
  int64_t rows_seen() const { return rows_seen_; }
  // H [cols][cols], both triangles filled.
  std::vector<double> Hessian() const;

 private:
  int64_t cols_;
  int64_t rows_seen_ = 0;
  std::vector<float> sum_;  // upper triangle in column-major (BLAS ssyrk's output)
};

// What GPTQ needs of H for every weight of the same input (q, k and v; gate and up): the column
// order (act-order or identity), the dead inputs, and U of the damped, permuted H⁻¹.
struct GptqFactor {
  int64_t cols = 0;
  std::vector<int32_t> perm;  // [cols]: stored column c is input column perm[c]
  std::vector<uint8_t> dead;  // [cols]: H[perm[c]][perm[c]] == 0 (the weight becomes 0)
  std::vector<float> u;       // [cols][cols], upper triangular
};

// The factor of H [cols][cols] (any positive scale; only its shape matters) under `options`
// (act_order, damp). FAILED_PRECONDITION when H cannot be made positive definite (damping raised
// tenfold up to 1, as GPTQ implementations do).
absl::StatusOr<GptqFactor> FactorGptq(std::vector<double> hessian, int64_t cols,
                                      const GptqOptions& options);

// Quantizes w[rows][cols] (PyTorch Linear layout) with a factor of its input's Hessian: the same
// codes as from that Hessian itself. The options' rules otherwise as QuantizeRtn's.
absl::StatusOr<QuantizedMatrix> QuantizeGptq(const float* w, int64_t rows, int64_t cols,
                                             const GptqFactor& factor, const GptqOptions& options);
// FactorGptq, then the above.
absl::StatusOr<QuantizedMatrix> QuantizeGptq(const float* w, int64_t rows, int64_t cols,
                                             std::vector<double> hessian,
                                             const GptqOptions& options);

// ‖X Wᵀ − X Qᵀ‖² / ‖X Wᵀ‖² with H = Xᵀ X: the relative output error of quantized m on the
// calibration inputs, which GPTQ minimises (for reports and tests).
double RelativeOutputError(const float* w, const QuantizedMatrix& m,
                           const std::vector<double>& hessian);

}  // namespace tandem
