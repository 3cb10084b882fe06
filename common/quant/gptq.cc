#include "common/quant/gptq.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"

// LAPACK's Cholesky factorisation and the inverse from it (OpenBLAS carries both).
extern "C" {
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info);
}

namespace tandem {
namespace {

// Cholesky of a symmetric positive definite a [n][n] (row-major, both triangles): on success the
// upper triangle holds U with a = Uᵀ U and the lower triangle is zeroed. LAPACK is column-major,
// so its lower factor L (a = L Lᵀ) is, read row-major, U = Lᵀ.
bool UpperCholesky(std::vector<double>* a, int n) {
  int info = 0;
  dpotrf_("L", &n, a->data(), &n, &info);
  if (info != 0) return false;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < i; ++j) (*a)[static_cast<size_t>(i) * n + j] = 0;
  }
  return true;
}

// The upper Cholesky factor of H⁻¹ (H positive definite): H⁻¹ = Uᵀ U.
bool InverseUpperCholesky(std::vector<double> h, int n, std::vector<double>* u) {
  int info = 0;
  dpotrf_("L", &n, h.data(), &n, &info);
  if (info != 0) return false;
  dpotri_("L", &n, h.data(), &n, &info);  // H⁻¹ in the upper triangle (row-major)
  if (info != 0) return false;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < i; ++j) {
      h[static_cast<size_t>(i) * n + j] = h[static_cast<size_t>(j) * n + i];
    }
  }
  *u = std::move(h);
  return UpperCholesky(u, n);
}

}  // namespace

HessianAccumulator::HessianAccumulator(int64_t cols)
    : cols_(cols), sum_(static_cast<size_t>(cols * cols), 0.f) {}

void HessianAccumulator::Add(const float* x, int64_t n) {
  if (n <= 0) return;
  // x [n][cols] row-major is xᵀ [cols][n] column-major: sum += xᵀ (xᵀ)ᵀ.
  cblas_ssyrk(CblasColMajor, CblasUpper, CblasNoTrans, static_cast<int>(cols_), static_cast<int>(n),
              1.f, x, static_cast<int>(cols_), 1.f, sum_.data(), static_cast<int>(cols_));
  rows_seen_ += n;
}

std::vector<double> HessianAccumulator::Hessian() const {
  std::vector<double> h(sum_.size());
  for (int64_t j = 0; j < cols_; ++j) {
    for (int64_t i = 0; i <= j; ++i) {
      const double v = sum_[i + j * cols_];  // column-major (i, j), i ≤ j
      h[i * cols_ + j] = v;
      h[j * cols_ + i] = v;
    }
  }
  return h;
}

absl::StatusOr<GptqFactor> FactorGptq(std::vector<double> h, int64_t cols, const GptqOptions& o) {
  const int64_t n = cols;
  if (static_cast<int64_t>(h.size()) != n * n) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPTQ: Hessian of ", h.size(), " values for ", n, " columns"));
  }
  GptqFactor f;
  f.cols = n;
  // Act-order: stored column c is input column perm[c]; dead inputs get weight 0.
  f.perm.resize(static_cast<size_t>(n));
  std::iota(f.perm.begin(), f.perm.end(), 0);
  if (o.act_order) {
    std::stable_sort(f.perm.begin(), f.perm.end(),
                     [&](int32_t a, int32_t b) { return h[a * n + a] > h[b * n + b]; });
  }
  f.dead.assign(static_cast<size_t>(n), 0);
  std::vector<double> hp(static_cast<size_t>(n * n));
  double mean_diag = 0;
  for (int64_t a = 0; a < n; ++a) {
    for (int64_t b = 0; b < n; ++b) hp[a * n + b] = h[f.perm[a] * n + f.perm[b]];
    f.dead[a] = hp[a * n + a] == 0;
    if (f.dead[a]) hp[a * n + a] = 1;
    mean_diag += hp[a * n + a];
  }
  mean_diag /= static_cast<double>(n);
  h.clear();
  h.shrink_to_fit();

  std::vector<double> u64;
  double damp = o.damp;
  for (;;) {
    std::vector<double> damped = hp;
    for (int64_t i = 0; i < n; ++i) damped[i * n + i] += damp * mean_diag;
    if (InverseUpperCholesky(std::move(damped), static_cast<int>(n), &u64)) break;
    if (damp >= 1) {
      return absl::FailedPreconditionError(
          "GPTQ: the calibration Hessian is not positive definite even damped by its mean "
          "diagonal (too few calibration tokens, or inputs that are not finite)");
    }
    damp = std::min(1.0, damp * 10);
  }
  f.u.assign(u64.begin(), u64.end());
  return f;
}

absl::StatusOr<QuantizedMatrix> QuantizeGptq(const float* w, int64_t rows, int64_t cols,
                                             std::vector<double> h, const GptqOptions& o) {
  ASSIGN_OR_RETURN(const GptqFactor f, FactorGptq(std::move(h), cols, o));
  return QuantizeGptq(w, rows, cols, f, o);
}

absl::StatusOr<QuantizedMatrix> QuantizeGptq(const float* w, int64_t rows, int64_t cols,
                                             const GptqFactor& f, const GptqOptions& o) {
  const int64_t n = cols;
  if (f.cols != n || static_cast<int64_t>(f.u.size()) != n * n) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPTQ: a factor of ", f.cols, " columns for ", n, " columns"));
  }
  const std::vector<int32_t>& perm = f.perm;
  const std::vector<float>& u = f.u;
  std::vector<float> wp(static_cast<size_t>(rows * n));
  for (int64_t a = 0; a < n; ++a) {
    for (int64_t r = 0; r < rows; ++r) wp[r * n + a] = f.dead[a] ? 0.f : w[r * n + perm[a]];
  }

  QuantizedMatrix m = MakeQuantizedMatrixFor(rows, cols, o.grid);
  if (o.act_order) m.perm = perm;
  const int64_t group = m.group_size, groups = m.num_groups();
  const int64_t block = std::max<int64_t>(1, o.block_size);
  std::vector<QuantGrid> grid(static_cast<size_t>(rows));
  std::vector<float> err(static_cast<size_t>(rows * block));  // [rows][block]
  for (int64_t i1 = 0; i1 < n; i1 += block) {
    const int64_t i2 = std::min(n, i1 + block);
    // Within a block each row is on its own: its columns rounded in order, each one's error
    // spread over the block's later columns.
    ThreadPool::Default().ParallelFor(rows, 4, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* wr = &wp[r * n];
        float* er = &err[r * block];
        for (int64_t c = i1; c < i2; ++c) {
          if (c % group == 0) {
            grid[r] = RtnGrid(wr + c, std::min(group, n - c), 1, o.grid);
            m.scales[r * groups + c / group] = grid[r].scale;
            if (!m.zeros.empty()) m.zeros[r * groups + c / group] = grid[r].zero;
          }
          const int q = grid[r].Code(wr[c]);
          m.SetCode(r, c, q);
          const float e = (wr[c] - grid[r].Value(q)) / u[c * n + c];
          er[c - i1] = e;
          const float* uc = &u[c * n];
          for (int64_t j = c + 1; j < i2; ++j) wr[j] -= e * uc[j];
        }
      }
    });
    // The rest of the matrix at once: W[:, i2:] −= Err · U[i1:i2, i2:].
    if (i2 < n) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                  static_cast<int>(n - i2), static_cast<int>(i2 - i1), -1.f, err.data(),
                  static_cast<int>(block), &u[i1 * n + i2], static_cast<int>(n), 1.f, &wp[i2],
                  static_cast<int>(n));
    }
  }
  return m;
}

double RelativeOutputError(const float* w, const QuantizedMatrix& m, const std::vector<double>& h) {
  const int64_t rows = m.rows, n = m.cols;
  const std::vector<float> q = Dequantize(m);
  std::vector<double> d(static_cast<size_t>(rows * n)), x(static_cast<size_t>(rows * n));
  for (int64_t i = 0; i < rows * n; ++i) {
    x[i] = w[i];
    d[i] = double{w[i]} - double{q[i]};
  }
  // Σ_r d_r H d_rᵀ over Σ_r w_r H w_rᵀ.
  std::vector<double> dh(d.size()), xh(x.size());
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
              static_cast<int>(n), static_cast<int>(n), 1.0, d.data(), static_cast<int>(n),
              h.data(), static_cast<int>(n), 0.0, dh.data(), static_cast<int>(n));
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
              static_cast<int>(n), static_cast<int>(n), 1.0, x.data(), static_cast<int>(n),
              h.data(), static_cast<int>(n), 0.0, xh.data(), static_cast<int>(n));
  double num = 0, den = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    num += dh[i] * d[i];
    den += xh[i] * x[i];
  }
  return den > 0 ? num / den : 0;
}

}  // namespace tandem
