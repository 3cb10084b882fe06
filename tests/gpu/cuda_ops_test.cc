// The CUDA backend's ops against the CPU backend: embedding, norms, GEMMs and the GEMV with its
// fused prologues and epilogues, 16-bit compute types, rounding handoffs, block copies, marks,
// memory, tunings, profiling, RoPE and the elementwise ops (tolerances: cuda_test_util.h).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cuda/cuda_backend.h"
#ifdef TANDEM_CUDA_EMULATED
#include "tests/support/cuda_emu/counters.h"
#endif
#include "common/backend/cuda/gemv.h"
#include "common/backend/cuda/kernels.h"
#include "common/backend/cuda/prefill_attention.h"
#include "common/backend/cuda/quant_gemv.h"
#include "common/backend/cuda/smoke_kernel.h"
#include "common/backend/kv_cache_storage.h"
#include "common/base/argmax.h"
#include "common/engine/engine.h"
#include "common/model/llama_model.h"
#include "common/quant/rtn.h"
#include "common/sampling/device_sampling.h"
#include "common/sampling/sampler.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/unit/tiny_models.h"

namespace tandem::cuda_test {
namespace {
TEST_F(CudaBackendTest, EmbeddingIsExactInEveryDtype) {
  const int64_t vocab = 300, d = 96, n = 37;
  const auto table = Random(vocab * d, 1);
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 97) % vocab);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto [wc, wg] = Weights(table, vocab, d, dt);
    std::vector<float> ref(n * d);
    cpu_->Embedding(wc, ids.data(), n, ref.data());
    float* out = Zeros(n * d);
    gpu_->Embedding(wg, Up(ids), n, out);
    EXPECT_EQ(Down(out, n * d), ref) << DTypeName(dt);
  }
}

TEST_F(CudaBackendTest, RmsNormMatches) {
  for (int64_t d : {64, 896, 4096}) {
    const int64_t n = 19;
    const auto x = Random(n * d, 2, 3.f), w = Random(d, 3);
    auto [wc, wg] = Weights(w, 1, d, DType::kBF16);
    std::vector<float> ref(n * d);
    cpu_->RmsNorm(x.data(), wc, 1e-6f, n, d, ref.data());
    float* xg = Up(x);
    gpu_->RmsNorm(xg, wg, 1e-6f, n, d, xg);  // in place, as the model does for q/k norm
    EXPECT_LE(MaxRelDiff(Down(xg, n * d), ref), 1e-5f) << "d " << d;
  }
}

TEST_F(CudaBackendTest, LinearMatchesInEveryDtypeAndBatch) {
  const int64_t rows = 96, cols = 160;
  const auto w = Random(rows * cols, 4, 0.1f), bias = Random(rows, 5);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto [wc, wg] = Weights(w, rows, cols, dt);
    auto [bc, bg] = Weights(bias, 1, rows, DType::kF32);
    for (int64_t n : {1, 7, 64, 300}) {
      for (bool with_bias : {false, true}) {
        auto x = Random(n * cols, 6 + n);
        std::vector<float> x_ref = x;
        float* xg = Up(x);
        // The GPU feeds 16-bit weights' GEMMs with activations rounded to the same type (its GEMV
        // for a few rows keeps them in f32).
        if (!cuda::GemvCovers(n, dt, cols, xg, wg.data)) {
          if (dt == DType::kBF16)
            for (float& v : x_ref) v = Bf16ToF32(F32ToBf16(v));
          if (dt == DType::kF16)
            for (float& v : x_ref) v = F16ToF32(F32ToF16(v));
        }
        std::vector<float> ref(n * rows);
        cpu_->Linear(x_ref.data(), n, wc, with_bias ? &bc : nullptr, ref.data());
        float* out = Zeros(n * rows);
        gpu_->Linear(xg, n, wg, with_bias ? &bg : nullptr, out);
        EXPECT_LE(MaxRelDiff(Down(out, n * rows), ref), 1e-4f)
            << DTypeName(dt) << " n " << n << " bias " << with_bias;
      }
    }
  }
}

// Quantized weights keep their codes (quant_gemv.h): up to 8 rows the dequantizing GEMV with f32
// activations gives the CPU's quantized Linear's result; more rows go through a BF16 dequantized
// copy and the GEMM path, as 16-bit weights do; act-order inputs are gathered first; a GEMV row's
// bits do not depend on the rows beside it.
TEST_F(CudaBackendTest, QuantizedLinearKeepsTheCodes) {
  const int64_t rows = 96, cols = 256;
  const auto w = Random(rows * cols, 14, 0.1f), bias = Random(rows, 15);
  auto [bc, bg] = Weights(bias, 1, rows, DType::kF32);
  struct Layout {
    QuantType type;
    int64_t group;
    bool act_order;
  };
  for (const Layout l :
       {Layout{QuantType::kInt8, 0, false}, Layout{QuantType::kInt8, 64, true},
        Layout{QuantType::kInt4, 128, false}, Layout{QuantType::kInt4, 64, true}}) {
    RtnOptions o;
    o.type = l.type;
    o.group_size = l.group;
    o.symmetric = false;
    auto m = std::make_shared<QuantizedMatrix>(QuantizeRtn(w.data(), rows, cols, o));
    if (l.act_order) {
      m->perm.resize(cols);
      std::iota(m->perm.begin(), m->perm.end(), 0);
      std::shuffle(m->perm.begin(), m->perm.end(), std::mt19937(3));
    }
    const DeviceWeight wc = cpu_->UploadQuantizedWeight(m).value();
    const DeviceWeight wg = gpu_->UploadQuantizedWeight(m).value();
    EXPECT_EQ(wg.quant, l.type);
    EXPECT_EQ(wg.bytes(), m->bytes());
    const std::string what =
        absl::StrCat(std::string(QuantTypeName(l.type)), " g", l.group, l.act_order ? " act" : "");
    std::vector<float> eight;  // the 8-row GEMV's output, for the single rows below
    for (int64_t n : {8, 1, 3, 12}) {
      const auto x = Random(n * cols, 20 + n);
      std::vector<float> ref(n * rows);
      cpu_->Linear(x.data(), n, wc, &bc, ref.data());
      float* out = Zeros(n * rows);
      gpu_->Linear(Up(x), n, wg, &bg, out);
      const std::vector<float> got = Down(out, n * rows);
      // 12 rows: weights and activations rounded to BF16 for the GEMM.
      EXPECT_LE(MaxRelDiff(got, ref), n <= cuda::kGemvMaxRows ? 1e-4f : 2e-2f)
          << what << " n " << n;
      if (n == 8) eight = got;
    }
    const auto x8 = Random(8 * cols, 28);
    for (int64_t t = 0; t < 8; ++t) {
      std::vector<float> row(x8.begin() + t * cols, x8.begin() + (t + 1) * cols);
      float* out = Zeros(rows);
      gpu_->Linear(Up(row), 1, wg, &bg, out);
      const std::vector<float> one = Down(out, rows);
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(one[r], eight[t * rows + r]) << what << " row " << t;
    }
  }
  EXPECT_TRUE(gpu_->CheckErrors().ok());
}

// The quantized GEMV against a double-precision product of the dequantized weights, over several
// activation tiles (42 blocks of 32 columns: two tiles from 5 rows up) and a column count no warp
// width divides, with 1, 2 and 4 columns a warp: every row the same bits whatever the columns and
// the rows beside it; and its fusions, the bits of the kernels they replace.
TEST_F(CudaBackendTest, QuantGemvIsTheSameForEveryColumnAndRowCount) {
  const int64_t m = 75, k = 1344;
  const auto w = Random(m * k, 41, 0.1f);
  const auto x = Random(cuda::kGemvMaxRows * k, 42);
  float* xg = Up(x);
  for (const auto& [type, group, symmetric] :
       {std::tuple{QuantType::kInt4, int64_t{64}, false}, std::tuple{QuantType::kInt8, k, true},
        std::tuple{QuantType::kInt8, int64_t{128}, false}}) {
    RtnOptions o;
    o.type = type;
    o.group_size = group;
    o.symmetric = symmetric;
    auto qm = std::make_shared<QuantizedMatrix>(QuantizeRtn(w.data(), m, k, o));
    const DeviceWeight wg = gpu_->UploadQuantizedWeight(qm).value();
    const cuda::QuantWeight q =
        cuda::MakeQuantWeight(type, m, k, qm->group_size, wg.data, wg.scales, wg.zeros, wg.perm);
    const std::string what = absl::StrCat(std::string(QuantTypeName(type)), " g", qm->group_size);
    std::vector<float> first;  // columns 1, 8 rows
    for (int columns : {1, 2, 4}) {
      for (int64_t n = cuda::kGemvMaxRows; n >= 1; --n) {
        float* out = Zeros(n * m);
        ASSERT_EQ(cuda::LaunchQuantGemv(xg, n, q, nullptr, out, nullptr, columns), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // (the legacy stream; Down reads on the
                                                          // backend's)
        const std::vector<float> got = Down(out, n * m);
        if (first.empty()) {
          first = got;
          double worst = 0;
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t c = 0; c < m; ++c) {
              double ref = 0, scale = 0;
              for (int64_t i = 0; i < k; ++i) {
                const double p = double(qm->Value(c, i)) * x[t * k + i];
                ref += p;
                scale += std::fabs(p);
              }
              worst = std::max(worst, std::fabs(got[t * m + c] - ref) / scale);
            }
          }
          // Two f32 sums a block (Σ q x exact products, Σ x) and the zero's term: f32 rounding.
          EXPECT_LE(worst, 1e-5 * std::sqrt(double(k))) << what;
        }
        for (int64_t i = 0; i < n * m; ++i) {
          ASSERT_EQ(got[i], first[i]) << what << " columns " << columns << " n " << n << " row "
                                      << i / m << " column " << i % m;
        }
      }
    }
  }
  // The fusions give the bits of the kernels they replace: the norm prologue (LaunchRmsNorm
  // first), the residual add (LaunchAdd after) and silu · up over [2m] rows (LaunchSiluMulPacked
  // after), at every column count.
  {
    const int64_t d = 40;  // output columns of the silu case: a [2d][k] gate|up weight
    RtnOptions o;
    o.type = QuantType::kInt4;
    o.group_size = 64;
    o.symmetric = false;
    const auto gate_up = Random(2 * d * k, 45, 0.1f);
    auto qm = std::make_shared<QuantizedMatrix>(QuantizeRtn(gate_up.data(), 2 * d, k, o));
    const DeviceWeight wg = gpu_->UploadQuantizedWeight(qm).value();
    const cuda::QuantWeight q = cuda::MakeQuantWeight(QuantType::kInt4, 2 * d, k, 64, wg.data,
                                                      wg.scales, wg.zeros, nullptr);
    const auto norm = Random(k, 43), residual = Random(cuda::kGemvMaxRows * 2 * d, 44);
    float* ng = Up(norm);
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{8}}) {
      for (int columns : {1, 2, 4}) {
        const std::string what = absl::StrCat("n ", n, " columns ", columns);
        float *normed = Zeros(n * k), *plain = Zeros(n * 2 * d), *fused = Zeros(n * 2 * d);
        ASSERT_EQ(cuda::LaunchRmsNorm(xg, ng, 1e-6f, n, k, normed, nullptr), cudaSuccess);
        ASSERT_EQ(cuda::LaunchQuantGemv(normed, n, q, nullptr, plain, nullptr, columns),
                  cudaSuccess);
        cuda::QuantGemvFusion with_norm;
        with_norm.norm = ng;
        with_norm.eps = 1e-6f;
        ASSERT_EQ(cuda::LaunchQuantGemv(xg, n, q, nullptr, fused, nullptr, columns, with_norm),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(Down(fused, n * 2 * d), Down(plain, n * 2 * d)) << "norm, " << what;
        // The residual: plain = residual + gemv, fused accumulates into the residual.
        float *sum = Up(residual), *into = Up(residual), *product = Zeros(n * 2 * d);
        ASSERT_EQ(cuda::LaunchQuantGemv(xg, n, q, nullptr, product, nullptr, columns), cudaSuccess);
        ASSERT_EQ(cuda::LaunchAdd(sum, product, n * 2 * d, nullptr), cudaSuccess);
        cuda::QuantGemvFusion accumulate;
        accumulate.accumulate = true;
        ASSERT_EQ(cuda::LaunchQuantGemv(xg, n, q, nullptr, into, nullptr, columns, accumulate),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(Down(into, n * 2 * d), Down(sum, n * 2 * d)) << "residual, " << what;
        // silu · up, with the norm too.
        float *separate = Zeros(n * d), *silu = Zeros(n * d);
        ASSERT_EQ(cuda::LaunchSiluMulPacked(plain, n, d, separate, nullptr), cudaSuccess);
        cuda::QuantGemvFusion silu_mul = with_norm;
        silu_mul.silu_mul = true;
        ASSERT_EQ(cuda::LaunchQuantGemv(xg, n, q, nullptr, silu, nullptr, columns, silu_mul),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(Down(silu, n * d), Down(separate, n * d)) << "silu, " << what;
      }
    }
  }
  // Column counts other than 0, 1, 2 and 4 are refused.
  EXPECT_EQ(
      cuda::LaunchQuantGemv(
          xg, 1, cuda::MakeQuantWeight(QuantType::kInt8, 32, 32, 32, xg, nullptr, nullptr, nullptr),
          nullptr, xg, nullptr, 3),
      cudaErrorInvalidValue);
  EXPECT_TRUE(gpu_->CheckErrors().ok());
}

// The decode GEMV on model-sized shapes (odd column counts, the unrolled loop and its tail) against
// a double-precision product of the same rounded weights and f32 activations; every row the same
// bits whatever the number of rows beside it.
TEST_F(CudaBackendTest, GemvMatchesADoubleProductAndIsTheSameForEveryRowCount) {
  struct Shape {
    int64_t m, k;
  };
  for (const Shape sh : {Shape{1000, 896}, Shape{333, 4096}, Shape{70, 8}, Shape{9, 1160}}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      const auto w = Random(sh.m * sh.k, 31, 0.05f);
      const auto x = Random(cuda::kGemvMaxRows * sh.k, 32);
      const DeviceWeight wg = gpu_->UploadWeight(View(w, sh.m, sh.k, dt)).value();
      std::vector<float> wr(w.size());  // the weights as stored
      for (size_t i = 0; i < w.size(); ++i) {
        wr[i] = dt == DType::kBF16 ? Bf16ToF32(F32ToBf16(w[i])) : F16ToF32(F32ToF16(w[i]));
      }
      float* xg = Up(x);
      std::vector<float> alone;
      for (int64_t n = 1; n <= cuda::kGemvMaxRows; ++n) {
        ASSERT_TRUE(cuda::GemvCovers(n, dt, sh.k, xg, wg.data));
        float* out = Zeros(n * sh.m);
        gpu_->Linear(xg, n, wg, nullptr, out);
        const std::vector<float> got = Down(out, n * sh.m);
        double worst = 0;
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t c = 0; c < sh.m; ++c) {
            double ref = 0, scale = 0;
            for (int64_t i = 0; i < sh.k; ++i) {
              ref += double(wr[c * sh.k + i]) * x[t * sh.k + i];
              scale += std::fabs(double(wr[c * sh.k + i]) * x[t * sh.k + i]);
            }
            worst = std::max(worst, std::fabs(got[t * sh.m + c] - ref) / (scale + 1e-30));
          }
        }
        // f32 accumulation of k exact products: well under k · 2^-24 of the sum of magnitudes.
        EXPECT_LE(worst, 1e-6 * std::sqrt(double(sh.k)))
            << DTypeName(dt) << " m " << sh.m << " k " << sh.k << " n " << n;
        if (n == 1) alone = got;
        EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + sh.m), alone)
            << "row 0 alone vs with " << n - 1 << " others: " << DTypeName(dt) << " k " << sh.k;
        // Two or four columns a warp: the same bits.
        for (int columns : {2, 4}) {
          float* other = Zeros(n * sh.m);
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, other, nullptr, columns),
                    cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(Down(other, n * sh.m), got) << columns << " columns a warp: " << DTypeName(dt)
                                                << " m " << sh.m << " k " << sh.k << " n " << n;
        }
      }
    }
  }
  EXPECT_EQ(cuda::LaunchGemv(nullptr, 1, DType::kBF16, nullptr, 8, 8, nullptr, nullptr, 3),
            cudaErrorInvalidValue);
  // Outside its shapes Linear goes to cuBLAS: k not a multiple of 8, more rows than it takes, F32.
  EXPECT_FALSE(cuda::GemvCovers(1, DType::kBF16, 100, nullptr, nullptr));
  EXPECT_FALSE(cuda::GemvCovers(cuda::kGemvMaxRows + 1, DType::kBF16, 64, nullptr, nullptr));
  EXPECT_FALSE(cuda::GemvCovers(1, DType::kF32, 64, nullptr, nullptr));
}

// The GEMV's epilogues (gemv.h) give the bits of the plain GEMV followed by the kernel they
// replace: the bias add, and silu · up over a [2m][k] gate|up weight; in every row count and
// columns a warp. Through the backend, LinearSiluMul matches the CPU's Linear then SiluMulPacked.
TEST_F(CudaBackendTest, GemvEpiloguesGiveTheBitsOfTheKernelsTheyReplace) {
  struct Shape {
    int64_t m, k;
  };
  const std::vector<int64_t> rows =
      kEmulated ? std::vector<int64_t>{1, 3, 8} : std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8};
  for (const Shape sh : {Shape{1000, 896}, Shape{333, 1024}, Shape{9, 1160}}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      const auto w = Random(2 * sh.m * sh.k, 51, 0.05f), x = Random(cuda::kGemvMaxRows * sh.k, 52),
                 bias = Random(sh.m, 53);
      const DeviceWeight wg = gpu_->UploadWeight(View(w, 2 * sh.m, sh.k, dt)).value();
      float *xg = Up(x), *bg = Up(bias);
      for (int64_t n : rows) {
        for (int columns : {1, 2, 4}) {
          const std::string what = absl::StrCat(std::string(DTypeName(dt)), " m ", sh.m, " k ",
                                                sh.k, " n ", n, " columns ", columns);
          // The bias: the first m rows of the weight.
          float *plain = Zeros(n * sh.m), *fused = Zeros(n * sh.m);
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, plain, nullptr, columns),
                    cudaSuccess);
          ASSERT_EQ(cuda::LaunchAddBias(plain, bg, n, sh.m, nullptr), cudaSuccess);
          cuda::GemvEpilogue with_bias;
          with_bias.bias = bg;
          ASSERT_EQ(
              cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, fused, nullptr, columns, with_bias),
              cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(),
                    cudaSuccess);  // (launched on the legacy stream; Down reads on the backend's)
          EXPECT_EQ(Down(fused, n * sh.m), Down(plain, n * sh.m)) << "bias, " << what;
          // silu · up: all 2m rows, then the packed activation.
          float *gate_up = Zeros(n * 2 * sh.m), *separate = Zeros(n * sh.m),
                *silu = Zeros(n * sh.m);
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, 2 * sh.m, sh.k, gate_up, nullptr, columns),
                    cudaSuccess);
          ASSERT_EQ(cuda::LaunchSiluMulPacked(gate_up, n, sh.m, separate, nullptr), cudaSuccess);
          cuda::GemvEpilogue silu_mul;
          silu_mul.silu_mul = true;
          ASSERT_EQ(
              cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, silu, nullptr, columns, silu_mul),
              cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(Down(silu, n * sh.m), Down(separate, n * sh.m)) << "silu-mul, " << what;
          if (columns != 1) continue;  // the norm and the accumulation take one column a warp
          // The norm prologue, with each epilogue: RmsNorm then the GEMV.
          const DeviceWeight nw =
              gpu_->UploadWeight(View(Random(sh.k, 55), 1, sh.k, DType::kF32)).value();
          cuda::GemvPrologue norm;
          norm.norm = static_cast<const float*>(nw.data);
          norm.eps = 1e-5f;
          float* h = Zeros(n * sh.k);
          ASSERT_EQ(cuda::LaunchRmsNorm(xg, norm.norm, norm.eps, n, sh.k, h, nullptr), cudaSuccess);
          for (const cuda::GemvEpilogue& e : {cuda::GemvEpilogue{}, with_bias, silu_mul}) {
            float *two = Zeros(n * sh.m), *one = Zeros(n * sh.m);
            ASSERT_EQ(cuda::LaunchGemv(h, n, dt, wg.data, sh.m, sh.k, two, nullptr, 1, e),
                      cudaSuccess);
            ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, one, nullptr, 1, e, norm),
                      cudaSuccess);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            EXPECT_EQ(Down(one, n * sh.m), Down(two, n * sh.m))
                << "norm prologue, bias " << (e.bias != nullptr) << " silu " << e.silu_mul << ", "
                << what;
          }
          // The residual add: out += the GEMV.
          const std::vector<float> residual = Random(n * sh.m, 56);
          float *acc = Up(residual), *sum = Up(residual);
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, plain, nullptr, 1),
                    cudaSuccess);
          ASSERT_EQ(cuda::LaunchAdd(sum, plain, n * sh.m, nullptr), cudaSuccess);
          cuda::GemvEpilogue accumulate;
          accumulate.accumulate = true;
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, acc, nullptr, 1, accumulate),
                    cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(Down(acc, n * sh.m), Down(sum, n * sh.m)) << "accumulate, " << what;
        }
      }
      // The backend's ops against the CPU's.
      const DeviceWeight wc = cpu_->UploadWeight(View(w, 2 * sh.m, sh.k, dt)).value();
      {
        const std::vector<float> nv = Random(sh.k, 57), res = Random(sh.m * 2 * 2, 58),
                                 xn = Random(2 * sh.k, 59);
        const DeviceWeight ng = gpu_->UploadWeight(View(nv, 1, sh.k, DType::kF32)).value();
        const DeviceWeight nc = cpu_->UploadWeight(View(nv, 1, sh.k, DType::kF32)).value();
        ASSERT_TRUE(gpu_->FusesNormsIntoLinear(2, wg));
        std::vector<float> h(2 * sh.k), scratch(2 * 2 * sh.m), ref(2 * sh.m), x_ref = xn;
        ComposedRmsNormLinear(*cpu_, x_ref.data(), 2, nc, 1e-5f, wc, nullptr, /*silu_mul=*/true,
                              h.data(), scratch.data(), ref.data());
        float* out = Zeros(2 * sh.m);
        gpu_->RmsNormLinear(Up(xn), 2, ng, 1e-5f, wg, nullptr, /*silu_mul=*/true, Zeros(2 * sh.k),
                            Zeros(4 * sh.m), out);
        EXPECT_LE(MaxRelDiff(Down(out, 2 * sh.m), ref), 1e-4f)
            << "RmsNormLinear, " << DTypeName(dt);
        std::vector<float> acc_ref = res;
        ComposedLinearResidual(*cpu_, xn.data(), 2, wc, scratch.data(), acc_ref.data());
        float* acc = Up(res);
        gpu_->LinearResidual(Up(xn), 2, wg, Zeros(4 * sh.m), acc);
        EXPECT_LE(MaxRelDiff(Down(acc, 4 * sh.m), acc_ref), 1e-4f)
            << "LinearResidual, " << DTypeName(dt);
      }
      for (int64_t n : {int64_t{1}, cuda::kGemvMaxRows, cuda::kGemvMaxRows + 3}) {
        const auto xn = Random(n * sh.k, 54 + n);
        std::vector<float> x_ref = xn, scratch(n * 2 * sh.m), ref(n * sh.m);
        float* xng = Up(xn);
        if (!cuda::GemvCovers(n, dt, sh.k, xng,
                              wg.data)) {  // cuBLAS: activations rounded to the weights' type
          for (float& v : x_ref)
            v = dt == DType::kBF16 ? Bf16ToF32(F32ToBf16(v)) : F16ToF32(F32ToF16(v));
        }
        cpu_->Linear(x_ref.data(), n, wc, nullptr, scratch.data());
        cpu_->SiluMulPacked(scratch.data(), n, sh.m, ref.data());
        float* out = Zeros(n * sh.m);
        gpu_->LinearSiluMul(xng, n, wg, Zeros(n * 2 * sh.m), out);
        EXPECT_LE(MaxRelDiff(Down(out, n * sh.m), ref), 1e-4f)
            << DTypeName(dt) << " m " << sh.m << " n " << n;
      }
    }
  }
  cuda::GemvEpilogue both, accumulate;
  both.silu_mul = true;
  both.bias = reinterpret_cast<const float*>(16);
  accumulate.accumulate = true;
  cuda::GemvPrologue norm;
  norm.norm = reinterpret_cast<const float*>(16);
  EXPECT_FALSE(cuda::GemvTakes(both, {}, 1));
  EXPECT_FALSE(cuda::GemvTakes(accumulate, {}, 2));
  EXPECT_FALSE(cuda::GemvTakes({}, norm, 4));
  EXPECT_FALSE(cuda::GemvTakes(accumulate, norm, 1));
  EXPECT_FALSE(cuda::GemvTakes({}, {}, 3));
  EXPECT_TRUE(cuda::GemvTakes(accumulate, {}, 1));
  EXPECT_TRUE(cuda::GemvTakes({}, norm, 1));
  EXPECT_EQ(cuda::LaunchGemv(reinterpret_cast<const float*>(16), 1, DType::kBF16,
                             reinterpret_cast<const void*>(16), 8, 8, nullptr, nullptr, 1, both),
            cudaErrorInvalidValue);
}

// Split GEMM inputs (hi + lo) against the exact product over the same BF16 weights, in both shapes:
// one GEMM of 2n columns (few rows) and two GEMMs (more than kSplitPairRows rows).
TEST_F(CudaBackendTest, SplitGemmInputsGiveAboutTheF32ProductInEitherShape) {
  CudaBackend::Options o;
  o.split_gemm_inputs = true;
  auto split = CudaBackend::Create(o).value();
  const int64_t m = 96, k = 256;
  const std::vector<float> wv = Random(m * k, 101, 0.05f);
  const TensorView t = View(wv, m, k, DType::kBF16);
  const DeviceWeight ws = split->UploadWeight(t).value(), wp = gpu_->UploadWeight(t).value();
  for (int64_t n : {int64_t{40}, CudaBackend::kSplitPairRows + 72}) {
    const std::vector<float> xv = Random(n * k, 102);
    float *x = Up(xv), *a = Zeros(n * m), *b = Zeros(n * m);
    split->Linear(x, n, ws, nullptr, a);
    ASSERT_TRUE(split->CheckErrors().ok());  // (its own stream: done before the fixture's copies)
    gpu_->Linear(x, n, wp, nullptr, b);
    const std::vector<float> got = Down(a, n * m), plain = Down(b, n * m);
    double worst_split = 0, worst_plain = 0;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < m; ++j) {
        double exact = 0;
        for (int64_t i = 0; i < k; ++i)
          exact += double(Bf16ToF32(F32ToBf16(wv[j * k + i]))) * xv[r * k + i];
        worst_split = std::max(worst_split, std::fabs(got[r * m + j] - exact));
        worst_plain = std::max(worst_plain, std::fabs(plain[r * m + j] - exact));
      }
    }
    std::printf("n=%lld: max |error| split %.3g, BF16-rounded inputs %.3g\n",
                static_cast<long long>(n), worst_split, worst_plain);
    EXPECT_LE(worst_split, 2e-4) << n;
    EXPECT_GT(worst_plain, 20 * worst_split) << n;  // (what splitting is for)
  }
}

// KV blocks to and from the host for the TCP transfer's staging: one gather or scatter on the copy
// stream, in index order; a gather after the ops enqueued before it (the emulator's deferred
// streams, emu.cuda_backend.ops_reversed, see old bytes without that order).
TEST_F(CudaBackendTest, BlocksGatherToAndScatterFromTheHostInIndexOrder) {
  const size_t floats = 16 * 2 * 64 / 2,
               bytes = floats * sizeof(float);  // a BF16 block of 16 tokens, 2 heads of 64
  const int64_t blocks = 12;
  const std::vector<float> initial = Random(blocks * floats, 91);
  float* cache = Up(initial);
  auto* base = reinterpret_cast<std::byte*>(cache);
  const std::vector<float> in = Random(3 * floats, 92);
  gpu_->ScatterFromHost(base, {7, 2, 9}, bytes, in.data());
  std::vector<float> out(4 * floats);
  gpu_->GatherToHost(base, {9, 7, 0, 2}, bytes, out.data(), /*after_enqueued_work=*/true);
  auto piece = [&](const std::vector<float>& v, size_t i) {
    return std::vector<float>(v.begin() + i * floats, v.begin() + (i + 1) * floats);
  };
  EXPECT_EQ(piece(out, 0), piece(in, 2));
  EXPECT_EQ(piece(out, 1), piece(in, 0));
  EXPECT_EQ(piece(out, 2), piece(initial, 0));
  EXPECT_EQ(piece(out, 3), piece(in, 1));
  // An op enqueued before the gather: its result is what is gathered.
  gpu_->Add(cache, Up(std::vector<float>(blocks * floats, 1.f)), blocks * floats);
  gpu_->GatherToHost(base, {0}, bytes, out.data(), /*after_enqueued_work=*/true);
  for (size_t j = 0; j < floats; ++j) ASSERT_EQ(out[j], initial[j] + 1.f) << j;
  // Pieces of a size the kernels do not take (not whole words) go piece by piece, the same bytes.
  std::vector<std::byte> odd(6), back(6);
  for (size_t j = 0; j < odd.size(); ++j) odd[j] = std::byte(0x40 + j);
  gpu_->ScatterFromHost(base, {1, 0}, 3, odd.data());
  gpu_->GatherToHost(base, {0, 1}, 3, back.data(), true);
  EXPECT_EQ(std::vector<std::byte>(back.begin(), back.begin() + 3),
            std::vector<std::byte>(odd.begin() + 3, odd.end()));
  EXPECT_EQ(std::vector<std::byte>(back.begin() + 3, back.end()),
            std::vector<std::byte>(odd.begin(), odd.begin() + 3));
  EXPECT_TRUE(gpu_->CheckErrors().ok());
}

// A KV transfer waits on a mark taken as its layer was enqueued, while later layers compute.
TEST_F(CudaBackendTest, AMarkWaitsForTheWorkBeforeItAlone) {
  const int64_t n = kEmulated ? 8 : 2048, d = kEmulated ? 64 : 4096;
  const DeviceWeight w =
      gpu_->UploadWeight(View(Random(d * d, 81, 0.02f), d, d, DType::kBF16)).value();
  float *x = Up(Random(n * d, 82)), *out = Zeros(n * d);
  gpu_->Linear(x, n, w, nullptr, out);
  const std::shared_ptr<WorkMark> first = gpu_->Mark();
  ASSERT_NE(first, nullptr);
  // On a GPU about 27 TFLOP of GEMMs after the mark: tens of milliseconds on an H100 or H200.
  for (int i = 0; i < (kEmulated ? 2 : 400); ++i) gpu_->Linear(x, n, w, nullptr, out);
  const std::shared_ptr<WorkMark> last = gpu_->Mark();
  ASSERT_NE(last, nullptr);
  const absl::Status s = first->Wait(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(s.ok()) << s;
  if (!kEmulated) {  // (the emulator runs each op as it is enqueued)
    EXPECT_EQ(last->Wait(absl::Now()).code(), absl::StatusCode::kDeadlineExceeded)
        << "the work after the first mark finished as soon as the work before it";
  }
  EXPECT_TRUE(last->Wait(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_TRUE(gpu_->CheckErrors().ok());
}

// The norms and silu · up write their output rounded for a cuBLAS GEMM that reads it next (steps of
// more rows than the GEMV takes): that GEMM gives the bits of one over a fresh copy of its input,
// and an op between the two (here an Add that changes the input) makes the GEMM convert it afresh.
TEST_F(CudaBackendTest, RoundedGemmInputsServeOnlyTheOpRightAfter) {
  const int64_t n = 40, d = 256, m = 96;
  const std::vector<float> wv = Random(m * d, 71, 0.05f), norm = Random(d, 72),
                           xv = Random(n * d, 73), yv = Random(n * d, 74), zv = Random(n * d, 75);
  const DeviceWeight w = gpu_->UploadWeight(View(wv, m, d, DType::kBF16)).value();
  const DeviceWeight nw = gpu_->UploadWeight(View(norm, 1, d, DType::kF32)).value();
  // GEMM over a fresh device copy of `input`.
  auto fresh = [&](const std::vector<float>& input) {
    float* out = Zeros(n * m);
    gpu_->Linear(Up(input), n, w, nullptr, out);
    return Down(out, n * m);
  };
  for (bool between : {false, true}) {
    float *x = Up(xv), *h = Zeros(n * d), *out = Zeros(n * m);
    gpu_->AddRmsNorm(x, Up(yv), nw, 1e-6f, n, d, h);
    if (between) gpu_->Add(h, Up(zv), n * d);
    gpu_->Linear(h, n, w, nullptr, out);
    EXPECT_EQ(Down(out, n * m), fresh(Down(h, n * d)))
        << (between ? "an Add between" : "right after");
  }
  // silu · up, and the plain norm.
  float *gu = Up(Random(n * 2 * d, 76)), *act = Zeros(n * d), *out = Zeros(n * m);
  gpu_->SiluMulPacked(gu, n, d, act);
  gpu_->Linear(act, n, w, nullptr, out);
  EXPECT_EQ(Down(out, n * m), fresh(Down(act, n * d))) << "silu-mul";
  float* normed = Zeros(n * d);
  gpu_->RmsNorm(Up(xv), nw, 1e-6f, n, d, normed);
  gpu_->Linear(normed, n, w, nullptr, out);
  EXPECT_EQ(Down(out, n * m), fresh(Down(normed, n * d))) << "rms norm";
}

TEST_F(CudaBackendTest, ComputeDTypeCastsSixteenBitWeightsAndRefusesWhatF16CannotHold) {
  CudaBackend::Options o;
  o.compute_dtype = DType::kF16;
  auto f16 = CudaBackend::Create(o).value();
  EXPECT_EQ(f16->StoredWeightDType(DType::kBF16), DType::kF16);
  EXPECT_EQ(f16->StoredWeightDType(DType::kF16), DType::kF16);
  EXPECT_EQ(f16->StoredWeightDType(DType::kF32), DType::kF32);
  EXPECT_EQ(gpu_->StoredWeightDType(DType::kBF16), DType::kBF16);
  EXPECT_NE(f16->device_description().find("16-bit weights and GEMMs in F16"), std::string::npos);
  // BF16 values F16 holds exactly (2^-14..65504), and ones below that, which round to F16's
  // subnormals.
  std::vector<float> values = Random(4 * 64, 31);
  values[0] = 65280.f;  // the largest BF16 value below F16's 65504 (the next, 65536, is beyond it)
  values[1] = -3.0e-6f;
  values[2] = 1e-9f;
  const TensorView t = View(values, 4, 64, DType::kBF16);
  const DeviceWeight w = f16->UploadWeight(t).value();
  EXPECT_EQ(w.dtype, DType::kF16);
  std::vector<uint16_t> back(values.size());
  f16->CopyToHost(back.data(), w.data, back.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const float bf16 = Bf16ToF32(F32ToBf16(values[i]));
    EXPECT_EQ(F16ToF32(back[i]), Bf16ToF32(F32ToBf16(F16ToF32(F32ToF16(bf16))))) << i;
    if (std::fabs(bf16) >= 6.103515625e-5f) {
      EXPECT_EQ(F16ToF32(back[i]), bf16) << i;  // exact in F16's normal range
    }
  }
  // Every BF16 value F16 can hold, through the upload's vector path: the bits of the scalar
  // conversion.
  std::vector<float> every;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float f = Bf16ToF32(static_cast<uint16_t>(bits));
    if (std::fabs(f) <= 65504.f) every.push_back(f);
  }
  every.resize(every.size() / 64 * 64);
  const DeviceWeight all =
      f16->UploadWeight(View(every, static_cast<int64_t>(every.size() / 64), 64, DType::kBF16))
          .value();
  std::vector<uint16_t> all_back(every.size());
  f16->CopyToHost(all_back.data(), all.data, all_back.size() * 2);
  int64_t differ = 0;
  for (size_t i = 0; i < every.size(); ++i) differ += all_back[i] != F32ToF16(every[i]);
  EXPECT_EQ(differ, 0) << "of " << every.size();
  // 1-D tensors become f32 vectors whatever the compute type; f32 matrices stay f32.
  EXPECT_EQ(f16->UploadWeight(View(values, 1, 64, DType::kBF16)).value().dtype, DType::kF32);
  EXPECT_EQ(f16->UploadWeight(View(values, 4, 64, DType::kF32)).value().dtype, DType::kF32);
  // Beyond F16's range: refused, naming the tensor, nothing kept.
  values[5] = 1e5f;
  const absl::StatusOr<DeviceWeight> big = f16->UploadWeight(View(values, 4, 64, DType::kBF16));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("tensor w holds 99840"), std::string::npos) << big.status();
  // BF16 takes F16 weights (rounding them to 8 significant bits).
  o.compute_dtype = DType::kBF16;
  auto bf16 = CudaBackend::Create(o).value();
  EXPECT_EQ(bf16->UploadWeight(View(values, 4, 64, DType::kF16)).value().dtype, DType::kBF16);
  // F32 is not a compute type of the GEMMs.
  o.compute_dtype = DType::kF32;
  EXPECT_EQ(CudaBackend::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(f16->CheckErrors().ok());
  EXPECT_TRUE(bf16->CheckErrors().ok());
}

TEST_F(CudaBackendTest, BadTuningVariablesAreRefusedAtStart) {
  for (const auto& [name, value] :
       std::vector<std::pair<const char*, const char*>>{{"TANDEM_CUDA_FUSION", "2"},
                                                        {"TANDEM_CUDA_GEMV_NORM", "yes"},
                                                        {"TANDEM_CUDA_GEMV_HEADS", "on"},
                                                        {"TANDEM_CUDA_GEMV_COLUMNS", "3"},
                                                        {"TANDEM_CUDA_GRID_SPLIT_KEYS", "48"}}) {
    ::setenv(name, value, 1);
    auto backend = CudaBackend::Create({});
    ::unsetenv(name);
    ASSERT_FALSE(backend.ok()) << name;
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(backend.status().message()).find(name), std::string::npos)
        << backend.status();
  }
  ::setenv("TANDEM_CUDA_GEMV_NORM", "0", 1);
  auto off = CudaBackend::Create({});
  ::unsetenv("TANDEM_CUDA_GEMV_NORM");
  ASSERT_TRUE(off.ok()) << off.status();
  const DeviceWeight w =
      (*off)->UploadWeight(View(Random(64 * 64, 1), 64, 64, DType::kBF16)).value();
  EXPECT_FALSE((*off)->FusesNormsIntoLinear(1, w));
  EXPECT_TRUE(gpu_->FusesNormsIntoLinear(
      1, gpu_->UploadWeight(View(Random(64 * 64, 1), 64, 64, DType::kBF16)).value()));
}

TEST_F(CudaBackendTest, OpProfilingTimesEachOpOutsideCaptures) {
  const int64_t rows = 64, cols = 128;
  auto [wc, wg] = Weights(Random(rows * cols, 41, 0.1f), rows, cols, DType::kBF16);
  float* x = Up(Random(cols, 42));
  float* out = Zeros(rows);
  EXPECT_EQ(gpu_->OpProfileReport(), "");  // off
  gpu_->SetOpProfiling(true);
  gpu_->Linear(x, 1, wg, nullptr, out);
  gpu_->Linear(x, 1, wg, nullptr, out);
  gpu_->Add(out, out, rows);
  ASSERT_TRUE(gpu_->CheckErrors().ok());
  const std::string report = gpu_->OpProfileReport();
  EXPECT_NE(report.find("gemv 64x128"), std::string::npos) << report;
  EXPECT_NE(report.find(" 2 "), std::string::npos) << report;  // the GEMV's two calls
  EXPECT_NE(report.find("add"), std::string::npos) << report;
  // Captured ops are not timed; the report starts afresh after each one.
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  gpu_->Add(out, out, rows);
  auto graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  const std::string after = gpu_->OpProfileReport();
  EXPECT_EQ(after.find("add "), std::string::npos) << after;
  gpu_->SetOpProfiling(false);
  EXPECT_EQ(gpu_->OpProfileReport(), "");
}

// Buffers come from the stream-ordered pool and go back in the stream's order: once freed, the
// memory counts as free again (the plan that sizes the KV pool reads it), and none is taken inside
// a capture.
TEST_F(CudaBackendTest, FreedBuffersCountAsFreeAgainAndNoneIsAllocatedInACapture) {
  const DeviceMemory before = gpu_->Memory().value();
  constexpr size_t kBytes = size_t{64} << 20;
  {
    auto buffer = gpu_->Allocate(kBytes);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    const DeviceMemory held = gpu_->Memory().value();
    EXPECT_EQ(held.own_bytes - before.own_bytes, static_cast<int64_t>(kBytes));
    EXPECT_LE(held.free_bytes, before.free_bytes - static_cast<int64_t>(kBytes));
  }
  const DeviceMemory after = gpu_->Memory().value();
  EXPECT_EQ(after.own_bytes, before.own_bytes);
  EXPECT_GE(after.free_bytes, before.free_bytes - (int64_t{2} << 20))
      << "the freed buffer stayed in the pool";
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  auto refused = gpu_->Allocate(4096);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(gpu_->EndCapture().ok());
  EXPECT_TRUE(gpu_->CheckErrors().ok());
}

TEST_F(CudaBackendTest, BatchInvariantLinearGivesEveryRowTheSameBitsAloneOrBatched) {
  auto inv = CudaBackend::Create({0, /*batch_invariant=*/true}).value();
  const int64_t rows = 256, cols = 384, n = 150;  // two full chunks of 64 and a padded one
  const auto w = Random(rows * cols, 21, 0.05f), x = Random(n * cols, 22);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const DeviceWeight wg = inv->UploadWeight(View(w, rows, cols, dt)).value();
    auto xb = inv->Allocate(x.size() * 4).value();
    auto ob = inv->Allocate(n * rows * 4).value();
    auto one = inv->Allocate(rows * 4).value();
    inv->CopyToDevice(xb->data(), x.data(), x.size() * 4);
    inv->Linear(xb->f32(), n, wg, nullptr, ob->f32());
    std::vector<float> batched(n * rows), alone(rows);
    inv->CopyToHost(batched.data(), ob->data(), batched.size() * 4);
    for (int64_t r : {int64_t{0}, int64_t{63}, int64_t{64}, int64_t{130}, n - 1}) {
      inv->Linear(xb->f32() + r * cols, 1, wg, nullptr, one->f32());
      inv->CopyToHost(alone.data(), one->data(), alone.size() * 4);
      EXPECT_EQ(std::vector<float>(batched.begin() + r * rows, batched.begin() + (r + 1) * rows),
                alone)
          << DTypeName(dt) << " row " << r;
    }
  }
  EXPECT_TRUE(inv->CheckErrors().ok());
}

TEST_F(CudaBackendTest, RopeMatches) {
  const int64_t n = 23, hq = 8, hk = 2;
  for (int64_t hd : {64, 128}) {
    auto q = Random(n * hq * hd, 7), k = Random(n * hk * hd, 8);
    std::vector<int32_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i * 173 % 4000);
    std::vector<float> inv(hd / 2);
    for (int64_t i = 0; i < hd / 2; ++i)
      inv[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / hd));
    float *qg = Up(q), *kg = Up(k);
    gpu_->Rope(qg, kg, Up(pos), Up(inv), n, hq, hk, hd);
    cpu_->Rope(q.data(), k.data(), pos.data(), inv.data(), n, hq, hk, hd);
    EXPECT_LE(MaxRelDiff(Down(qg, q.size()), q), 1e-4f) << "head_dim " << hd;
    EXPECT_LE(MaxRelDiff(Down(kg, k.size()), k), 1e-4f) << "head_dim " << hd;
  }
}

TEST_F(CudaBackendTest, ElementwiseOpsMatch) {
  const int64_t n = 17, d = 1000;
  const auto gate = Random(n * d, 9, 3.f), up = Random(n * d, 10), y = Random(n * d, 11);
  std::vector<float> ref(n * d);
  cpu_->SiluMul(gate.data(), up.data(), n, d, ref.data());
  float* g = Up(gate);
  gpu_->SiluMul(g, Up(up), n, d, g);
  EXPECT_LE(MaxRelDiff(Down(g, n * d), ref), 2e-6f);

  std::vector<float> x = gate;
  cpu_->Add(x.data(), y.data(), n * d);
  float* xg = Up(gate);
  gpu_->Add(xg, Up(y), n * d);
  EXPECT_EQ(Down(xg, n * d), x);

  const std::vector<int32_t> rows = {16, 0, 3, 3, 9};
  std::vector<float> gathered(rows.size() * d);
  cpu_->GatherRows(gate.data(), rows.data(), rows.size(), d, gathered.data());
  float* out = Zeros(rows.size() * d);
  gpu_->GatherRows(Up(gate), Up(rows), rows.size(), d, out);
  EXPECT_EQ(Down(out, rows.size() * d), gathered);

  // The residual add fused with the next norm: the same bits as Add then RmsNorm, out aliasing y.
  {
    const std::vector<float> wv = Random(d, 12);
    const DeviceWeight w = gpu_->UploadWeight(View(wv, 1, d, DType::kF32)).value();
    float *x1 = Up(gate), *y1 = Up(y), *o1 = Zeros(n * d);
    gpu_->Add(x1, y1, n * d);
    gpu_->RmsNorm(x1, w, 1e-6f, n, d, o1);
    float *x2 = Up(gate), *y2 = Up(y);
    gpu_->AddRmsNorm(x2, y2, w, 1e-6f, n, d, y2);
    EXPECT_EQ(Down(x2, n * d), Down(x1, n * d));
    EXPECT_EQ(Down(y2, n * d), Down(o1, n * d));
  }

  // Packed gate|up rows (n rows of 2 d/2 ... here halves of d) and column copies out of them.
  const int64_t half = d / 2;
  std::vector<float> packed_ref(n * half);
  cpu_->SiluMulPacked(gate.data(), n, half, packed_ref.data());
  float* packed = Zeros(n * half);
  gpu_->SiluMulPacked(Up(gate), n, half, packed);
  EXPECT_LE(MaxRelDiff(Down(packed, n * half), packed_ref), 2e-6f);
  std::vector<float> cols_ref(n * 300);
  cpu_->CopyColumns(gate.data(), n, d, 123, 300, cols_ref.data());
  float* cols = Zeros(n * 300);
  gpu_->CopyColumns(Up(gate), n, d, 123, 300, cols);
  EXPECT_EQ(Down(cols, n * 300), cols_ref);
}

TEST_F(CudaBackendTest, BadLaunchBecomesTheStickyError) {
  // head_dim beyond what the attention kernel supports: refused before anything is launched (the
  // null metadata is never read), reported by CheckErrors of this backend only.
  auto other = CudaBackend::Create({}).value();
  KvCacheGeometry g;
  g.num_layers = 1;
  g.num_blocks = 1;
  g.block_size = 16;
  g.num_kv_heads = 1;
  g.head_dim = 1024;
  AttentionMetadata md;
  md.num_seqs = 1;
  md.num_tokens = 1;
  auto buf = other->Allocate(1 << 20).value();
  other->PagedAttention(buf->f32(), buf->f32(), buf->f32(), buf->f32(), buf->f32(), g, 0, md, 1,
                        1.f, buf->f32());
  const absl::Status s = other->CheckErrors();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("paged attention"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace tandem::cuda_test
