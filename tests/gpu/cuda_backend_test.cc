// The CUDA backend against the CPU backend (the reference), op by op on random inputs and then the
// whole forward pass of every tiny preset. Exit code 77 (ctest: skipped, label "gpu") without a device.
//
// Tolerances: ops that round the same way (embedding, gather, add) must match exactly; f32 arithmetic
// in another order (norm, rope, silu, SGEMM, attention) within 1e-4 of unit-scale values; GEMMs over
// 16-bit weights are compared against the CPU on the same 16-bit-rounded activations. The whole model
// in F32 agrees within 2e-3 on logits of magnitude ~10 and on every greedy choice; in BF16 (activations
// rounded for the tensor cores) within |Δp| ≤ 1e-2 and the same top-1 wherever the CPU's margin is
// clear.
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
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cuda/cuda_backend.h"
#ifdef TANDEM_CUDA_EMULATED
#include "common/backend/cuda/emu/counters.h"
#endif
#include "common/backend/cuda/gemv.h"
#include "common/backend/cuda/kernels.h"
#include "common/backend/cuda/prefill_attention.h"
#include "common/backend/cuda/smoke_kernel.h"
#include "common/backend/kv_cache_storage.h"
#include "common/engine/engine.h"
#include "common/base/argmax.h"
#include "common/model/llama_model.h"
#include "common/sampling/device_sampling.h"
#include "common/sampling/sampler.h"
#include "gtest/gtest.h"
#include "tests/unit/tiny_models.h"

namespace tandem {
namespace {

// Built against the CUDA emulator (common/backend/cuda/emu, ctest emu.*): the same tests on the CPU,
// where the two costliest sweeps (prompt attention's configurations, the decode script's prompt
// lengths) take a sample that still reaches every kernel and every key split.
#ifdef TANDEM_CUDA_EMULATED
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Max over i of |a - b| / (1 + |b|).
float MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]) / (1.f + std::fabs(b[i])));
  }
  return d;
}

struct AttentionCase;  // below, with the attention tests

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The backend's kAuto is checked against the CUDA-core prompt kernel: not the tensor-core one.
    ::unsetenv("TANDEM_CUDA_TC_ATTENTION");
    cpu_ = CpuBackend::Create({}).value();
    auto cuda = CudaBackend::Create({});
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    gpu_ = std::move(cuda).value();
  }
  void TearDown() override {
    if (gpu_) {
      EXPECT_TRUE(gpu_->CheckErrors().ok()) << gpu_->CheckErrors();
    }
  }

  // A device copy of `host` (ints or floats), kept alive by the fixture.
  template <typename T>
  T* Up(const std::vector<T>& host) {
    auto buf = gpu_->Allocate(std::max<size_t>(host.size(), 1) * sizeof(T)).value();
    gpu_->CopyToDevice(buf->data(), host.data(), host.size() * sizeof(T));
    T* p = static_cast<T*>(buf->data());
    buffers_.push_back(std::move(buf));
    return p;
  }
  float* Zeros(size_t n) { return Up(std::vector<float>(n, 0.f)); }
  // The case's attention metadata with every array copied to the device.
  AttentionMetadata OnDevice(const AttentionCase& c);
  std::vector<float> Down(const float* dev, size_t n) {
    std::vector<float> host(n);
    gpu_->CopyToHost(host.data(), dev, n * sizeof(float));
    return host;
  }
  // A checkpoint tensor [rows][cols] (a vector when rows == 1) of `f32` stored as `dtype` (values
  // rounded to it); its bytes live as long as the fixture, as the CPU backend maps 2-D weights in place.
  TensorView View(const std::vector<float>& f32, int64_t rows, int64_t cols, DType dtype) {
    auto bytes = std::make_shared<std::vector<uint16_t>>();
    TensorView t;
    t.name = "w";
    t.dtype = dtype;
    t.shape = rows == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{rows, cols};
    if (dtype == DType::kF32) {
      t.data = reinterpret_cast<const std::byte*>(f32.data());
      t.nbytes = f32.size() * 4;
    } else {
      for (float x : f32) bytes->push_back(dtype == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x));
      t.data = reinterpret_cast<const std::byte*>(bytes->data());
      t.nbytes = bytes->size() * 2;
      host_bytes_.push_back(bytes);
    }
    return t;
  }
  // Both backends' copies of that weight.
  std::pair<DeviceWeight, DeviceWeight> Weights(const std::vector<float>& f32, int64_t rows, int64_t cols, DType dtype) {
    const TensorView t = View(f32, rows, cols, dtype);
    return {cpu_->UploadWeight(t).value(), gpu_->UploadWeight(t).value()};
  }

  std::unique_ptr<CpuBackend> cpu_;
  std::unique_ptr<CudaBackend> gpu_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  std::vector<std::shared_ptr<std::vector<uint16_t>>> host_bytes_;
};

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
        // The GPU feeds 16-bit weights' GEMMs with activations rounded to the same type (its GEMV for
        // a few rows keeps them in f32).
        if (!cuda::GemvCovers(n, dt, cols, xg, wg.data)) {
          if (dt == DType::kBF16) for (float& v : x_ref) v = Bf16ToF32(F32ToBf16(v));
          if (dt == DType::kF16) for (float& v : x_ref) v = F16ToF32(F32ToF16(v));
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

// The decode GEMV on model-sized shapes (odd column counts, the unrolled loop and its tail) against
// a double-precision product of the same rounded weights and f32 activations; every row the same bits
// whatever the number of rows beside it.
TEST_F(CudaBackendTest, GemvMatchesADoubleProductAndIsTheSameForEveryRowCount) {
  struct Shape { int64_t m, k; };
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
        EXPECT_LE(worst, 1e-6 * std::sqrt(double(sh.k))) << DTypeName(dt) << " m " << sh.m << " k " << sh.k << " n " << n;
        if (n == 1) alone = got;
        EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + sh.m), alone)
            << "row 0 alone vs with " << n - 1 << " others: " << DTypeName(dt) << " k " << sh.k;
        // Two or four columns a warp: the same bits.
        for (int columns : {2, 4}) {
          float* other = Zeros(n * sh.m);
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, other, nullptr, columns), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(Down(other, n * sh.m), got) << columns << " columns a warp: " << DTypeName(dt) << " m " << sh.m
                                                << " k " << sh.k << " n " << n;
        }
      }
    }
  }
  EXPECT_EQ(cuda::LaunchGemv(nullptr, 1, DType::kBF16, nullptr, 8, 8, nullptr, nullptr, 3), cudaErrorInvalidValue);
  // Outside its shapes Linear goes to cuBLAS: k not a multiple of 8, more rows than it takes, F32.
  EXPECT_FALSE(cuda::GemvCovers(1, DType::kBF16, 100, nullptr, nullptr));
  EXPECT_FALSE(cuda::GemvCovers(cuda::kGemvMaxRows + 1, DType::kBF16, 64, nullptr, nullptr));
  EXPECT_FALSE(cuda::GemvCovers(1, DType::kF32, 64, nullptr, nullptr));
}

// The GEMV's epilogues (gemv.h) give the bits of the plain GEMV followed by the kernel they replace: the
// bias add, and silu · up over a [2m][k] gate|up weight; in every row count and columns a warp. Through
// the backend, LinearSiluMul matches the CPU's Linear then SiluMulPacked.
TEST_F(CudaBackendTest, GemvEpiloguesGiveTheBitsOfTheKernelsTheyReplace) {
  struct Shape { int64_t m, k; };
  const std::vector<int64_t> rows = kEmulated ? std::vector<int64_t>{1, 3, 8} : std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8};
  for (const Shape sh : {Shape{1000, 896}, Shape{333, 1024}, Shape{9, 1160}}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      const auto w = Random(2 * sh.m * sh.k, 51, 0.05f), x = Random(cuda::kGemvMaxRows * sh.k, 52),
                 bias = Random(sh.m, 53);
      const DeviceWeight wg = gpu_->UploadWeight(View(w, 2 * sh.m, sh.k, dt)).value();
      float *xg = Up(x), *bg = Up(bias);
      for (int64_t n : rows) {
        for (int columns : {1, 2, 4}) {
          const std::string what = absl::StrCat(std::string(DTypeName(dt)), " m ", sh.m, " k ", sh.k, " n ", n, " columns ", columns);
          // The bias: the first m rows of the weight.
          float *plain = Zeros(n * sh.m), *fused = Zeros(n * sh.m);
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, plain, nullptr, columns), cudaSuccess);
          ASSERT_EQ(cuda::LaunchAddBias(plain, bg, n, sh.m, nullptr), cudaSuccess);
          cuda::GemvEpilogue with_bias;
          with_bias.bias = bg;
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, fused, nullptr, columns, with_bias), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // (launched on the legacy stream; Down reads on the backend's)
          EXPECT_EQ(Down(fused, n * sh.m), Down(plain, n * sh.m)) << "bias, " << what;
          // silu · up: all 2m rows, then the packed activation.
          float *gate_up = Zeros(n * 2 * sh.m), *separate = Zeros(n * sh.m), *silu = Zeros(n * sh.m);
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, 2 * sh.m, sh.k, gate_up, nullptr, columns), cudaSuccess);
          ASSERT_EQ(cuda::LaunchSiluMulPacked(gate_up, n, sh.m, separate, nullptr), cudaSuccess);
          cuda::GemvEpilogue silu_mul;
          silu_mul.silu_mul = true;
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, silu, nullptr, columns, silu_mul), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(Down(silu, n * sh.m), Down(separate, n * sh.m)) << "silu-mul, " << what;
          if (columns != 1) continue;  // the norm and the accumulation take one column a warp
          // The norm prologue, with each epilogue: RmsNorm then the GEMV.
          const DeviceWeight nw = gpu_->UploadWeight(View(Random(sh.k, 55), 1, sh.k, DType::kF32)).value();
          cuda::GemvPrologue norm;
          norm.norm = static_cast<const float*>(nw.data);
          norm.eps = 1e-5f;
          float* h = Zeros(n * sh.k);
          ASSERT_EQ(cuda::LaunchRmsNorm(xg, norm.norm, norm.eps, n, sh.k, h, nullptr), cudaSuccess);
          for (const cuda::GemvEpilogue& e : {cuda::GemvEpilogue{}, with_bias, silu_mul}) {
            float *two = Zeros(n * sh.m), *one = Zeros(n * sh.m);
            ASSERT_EQ(cuda::LaunchGemv(h, n, dt, wg.data, sh.m, sh.k, two, nullptr, 1, e), cudaSuccess);
            ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, one, nullptr, 1, e, norm), cudaSuccess);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            EXPECT_EQ(Down(one, n * sh.m), Down(two, n * sh.m))
                << "norm prologue, bias " << (e.bias != nullptr) << " silu " << e.silu_mul << ", " << what;
          }
          // The residual add: out += the GEMV.
          const std::vector<float> residual = Random(n * sh.m, 56);
          float *acc = Up(residual), *sum = Up(residual);
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, plain, nullptr, 1), cudaSuccess);
          ASSERT_EQ(cuda::LaunchAdd(sum, plain, n * sh.m, nullptr), cudaSuccess);
          cuda::GemvEpilogue accumulate;
          accumulate.accumulate = true;
          ASSERT_EQ(cuda::LaunchGemv(xg, n, dt, wg.data, sh.m, sh.k, acc, nullptr, 1, accumulate), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(Down(acc, n * sh.m), Down(sum, n * sh.m)) << "accumulate, " << what;
        }
      }
      // The backend's ops against the CPU's.
      const DeviceWeight wc = cpu_->UploadWeight(View(w, 2 * sh.m, sh.k, dt)).value();
      {
        const std::vector<float> nv = Random(sh.k, 57), res = Random(sh.m * 2 * 2, 58), xn = Random(2 * sh.k, 59);
        const DeviceWeight ng = gpu_->UploadWeight(View(nv, 1, sh.k, DType::kF32)).value();
        const DeviceWeight nc = cpu_->UploadWeight(View(nv, 1, sh.k, DType::kF32)).value();
        ASSERT_TRUE(gpu_->FusesNormsIntoLinear(2, wg));
        std::vector<float> h(2 * sh.k), scratch(2 * 2 * sh.m), ref(2 * sh.m), x_ref = xn;
        cpu_->RmsNormLinear(x_ref.data(), 2, nc, 1e-5f, wc, nullptr, /*silu_mul=*/true, h.data(), scratch.data(),
                            ref.data());
        float* out = Zeros(2 * sh.m);
        gpu_->RmsNormLinear(Up(xn), 2, ng, 1e-5f, wg, nullptr, /*silu_mul=*/true, Zeros(2 * sh.k), Zeros(4 * sh.m), out);
        EXPECT_LE(MaxRelDiff(Down(out, 2 * sh.m), ref), 1e-4f) << "RmsNormLinear, " << DTypeName(dt);
        std::vector<float> acc_ref = res;
        cpu_->LinearResidual(xn.data(), 2, wc, scratch.data(), acc_ref.data());
        float* acc = Up(res);
        gpu_->LinearResidual(Up(xn), 2, wg, Zeros(4 * sh.m), acc);
        EXPECT_LE(MaxRelDiff(Down(acc, 4 * sh.m), acc_ref), 1e-4f) << "LinearResidual, " << DTypeName(dt);
      }
      for (int64_t n : {int64_t{1}, cuda::kGemvMaxRows, cuda::kGemvMaxRows + 3}) {
        const auto xn = Random(n * sh.k, 54 + n);
        std::vector<float> x_ref = xn, scratch(n * 2 * sh.m), ref(n * sh.m);
        float* xng = Up(xn);
        if (!cuda::GemvCovers(n, dt, sh.k, xng, wg.data)) {  // cuBLAS: activations rounded to the weights' type
          for (float& v : x_ref) v = dt == DType::kBF16 ? Bf16ToF32(F32ToBf16(v)) : F16ToF32(F32ToF16(v));
        }
        cpu_->Linear(x_ref.data(), n, wc, nullptr, scratch.data());
        cpu_->SiluMulPacked(scratch.data(), n, sh.m, ref.data());
        float* out = Zeros(n * sh.m);
        gpu_->LinearSiluMul(xng, n, wg, Zeros(n * 2 * sh.m), out);
        EXPECT_LE(MaxRelDiff(Down(out, n * sh.m), ref), 1e-4f) << DTypeName(dt) << " m " << sh.m << " n " << n;
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
  EXPECT_EQ(cuda::LaunchGemv(reinterpret_cast<const float*>(16), 1, DType::kBF16, reinterpret_cast<const void*>(16), 8,
                             8, nullptr, nullptr, 1, both),
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
        for (int64_t i = 0; i < k; ++i) exact += double(Bf16ToF32(F32ToBf16(wv[j * k + i]))) * xv[r * k + i];
        worst_split = std::max(worst_split, std::fabs(got[r * m + j] - exact));
        worst_plain = std::max(worst_plain, std::fabs(plain[r * m + j] - exact));
      }
    }
    std::printf("n=%lld: max |error| split %.3g, BF16-rounded inputs %.3g\n", static_cast<long long>(n), worst_split,
                worst_plain);
    EXPECT_LE(worst_split, 2e-4) << n;
    EXPECT_GT(worst_plain, 20 * worst_split) << n;  // (what splitting is for)
  }
}

// KV blocks to and from the host for the TCP transfer's staging: one gather or scatter on the copy
// stream, in index order; a gather after the ops enqueued before it (the emulator's deferred streams,
// emu.cuda_backend.ops_reversed, see old bytes without that order).
TEST_F(CudaBackendTest, BlocksGatherToAndScatterFromTheHostInIndexOrder) {
  const size_t floats = 16 * 2 * 64 / 2, bytes = floats * sizeof(float);  // a BF16 block of 16 tokens, 2 heads of 64
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
  EXPECT_EQ(std::vector<std::byte>(back.begin(), back.begin() + 3), std::vector<std::byte>(odd.begin() + 3, odd.end()));
  EXPECT_EQ(std::vector<std::byte>(back.begin() + 3, back.end()), std::vector<std::byte>(odd.begin(), odd.begin() + 3));
  EXPECT_TRUE(gpu_->CheckErrors().ok());
}

// A KV transfer waits on a mark taken as its layer was enqueued, while later layers compute.
TEST_F(CudaBackendTest, AMarkWaitsForTheWorkBeforeItAlone) {
  const int64_t n = kEmulated ? 8 : 2048, d = kEmulated ? 64 : 4096;
  const DeviceWeight w = gpu_->UploadWeight(View(Random(d * d, 81, 0.02f), d, d, DType::kBF16)).value();
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
// more rows than the GEMV takes): that GEMM gives the bits of one over a fresh copy of its input, and
// an op between the two (here an Add that changes the input) makes the GEMM convert it afresh.
TEST_F(CudaBackendTest, RoundedGemmInputsServeOnlyTheOpRightAfter) {
  const int64_t n = 40, d = 256, m = 96;
  const std::vector<float> wv = Random(m * d, 71, 0.05f), norm = Random(d, 72), xv = Random(n * d, 73),
                           yv = Random(n * d, 74), zv = Random(n * d, 75);
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
    EXPECT_EQ(Down(out, n * m), fresh(Down(h, n * d))) << (between ? "an Add between" : "right after");
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
  // BF16 values F16 holds exactly (2^-14..65504), and ones below that, which round to F16's subnormals.
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
  // Every BF16 value F16 can hold, through the upload's vector path: the bits of the scalar conversion.
  std::vector<float> every;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float f = Bf16ToF32(static_cast<uint16_t>(bits));
    if (std::fabs(f) <= 65504.f) every.push_back(f);
  }
  every.resize(every.size() / 64 * 64);
  const DeviceWeight all = f16->UploadWeight(View(every, static_cast<int64_t>(every.size() / 64), 64, DType::kBF16)).value();
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
  for (const auto& [name, value] : std::vector<std::pair<const char*, const char*>>{
           {"TANDEM_CUDA_FUSION", "2"}, {"TANDEM_CUDA_GEMV_NORM", "yes"}, {"TANDEM_CUDA_GEMV_HEADS", "on"},
           {"TANDEM_CUDA_GEMV_COLUMNS", "3"}, {"TANDEM_CUDA_GRID_SPLIT_KEYS", "48"}}) {
    ::setenv(name, value, 1);
    auto backend = CudaBackend::Create({});
    ::unsetenv(name);
    ASSERT_FALSE(backend.ok()) << name;
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(backend.status().message()).find(name), std::string::npos) << backend.status();
  }
  ::setenv("TANDEM_CUDA_GEMV_NORM", "0", 1);
  auto off = CudaBackend::Create({});
  ::unsetenv("TANDEM_CUDA_GEMV_NORM");
  ASSERT_TRUE(off.ok()) << off.status();
  const DeviceWeight w = (*off)->UploadWeight(View(Random(64 * 64, 1), 64, 64, DType::kBF16)).value();
  EXPECT_FALSE((*off)->FusesNormsIntoLinear(1, w));
  EXPECT_TRUE(gpu_->FusesNormsIntoLinear(1, gpu_->UploadWeight(View(Random(64 * 64, 1), 64, 64, DType::kBF16)).value()));
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

// Buffers come from the stream-ordered pool and go back in the stream's order: once freed, the memory
// counts as free again (the plan that sizes the KV pool reads it), and none is taken inside a capture.
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
  EXPECT_GE(after.free_bytes, before.free_bytes - (int64_t{2} << 20)) << "the freed buffer stayed in the pool";
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
      EXPECT_EQ(std::vector<float>(batched.begin() + r * rows, batched.begin() + (r + 1) * rows), alone)
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
    for (int64_t i = 0; i < hd / 2; ++i) inv[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / hd));
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

// A batch mixing a fresh prefill, a chunk after a cached prefix, and decode tokens over contexts
// longer than one tile of keys, with scattered block tables and grouped-query heads.
// A mixed batch over a shuffled paged cache: a fresh prefill, decodes over 300- and 700-token
// contexts (two splits of the split-KV kernels), a chunk after a cached prefix, a short one.
struct AttentionCase {
  KvCacheGeometry g;
  int64_t hq = 8, layer = 1, n = 0, max_context = 0;
  std::vector<int32_t> seq_indptr{0}, positions, context_lens, block_indptr{0}, blocks, slots;
  std::vector<float> kc, vc, q, k, v;

  struct Seq {
    int64_t cached, fresh;
  };
  AttentionCase(int64_t hd, int64_t num_q_heads, int64_t num_kv_heads, const std::vector<Seq>& seqs) : hq(num_q_heads) {
    g.num_layers = 2;
    g.num_blocks = 128;
    g.block_size = 16;
    g.num_kv_heads = num_kv_heads;
    g.head_dim = hd;
    std::vector<int32_t> perm(g.num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<uint32_t>(hd)));
    size_t next_block = 0;
    for (const Seq& s : seqs) {
      const int64_t context = s.cached + s.fresh, nblocks = (context + g.block_size - 1) / g.block_size;
      const size_t first = blocks.size();
      for (int64_t b = 0; b < nblocks; ++b) blocks.push_back(perm[next_block++]);
      for (int64_t i = 0; i < s.fresh; ++i) {
        const int64_t p = s.cached + i;
        positions.push_back(static_cast<int32_t>(p));
        slots.push_back(static_cast<int32_t>(blocks[first + p / g.block_size] * g.block_size + p % g.block_size));
      }
      seq_indptr.push_back(seq_indptr.back() + static_cast<int32_t>(s.fresh));
      context_lens.push_back(static_cast<int32_t>(context));
      block_indptr.push_back(static_cast<int32_t>(blocks.size()));
      max_context = std::max(max_context, context);
    }
    n = seq_indptr.back();
    const size_t cache_elems = g.num_layers * g.elements_per_layer();
    kc = Random(cache_elems, 12);  // the cached prefixes
    vc = Random(cache_elems, 13);
    q = Random(n * hq * hd, 14);
    k = Random(n * g.num_kv_heads * hd, 15);
    v = Random(n * g.num_kv_heads * hd, 16);
  }
  AttentionMetadata Host() const {
    AttentionMetadata md;
    md.num_seqs = static_cast<int64_t>(context_lens.size());
    md.num_tokens = n;
    md.max_context_len = max_context;
    md.seq_indptr = seq_indptr.data();
    md.positions = positions.data();
    md.context_lens = context_lens.data();
    md.block_indptr = block_indptr.data();
    md.block_indices = blocks.data();
    md.slot_mapping = slots.data();
    return md;
  }
  float scale() const { return 1.f / std::sqrt(static_cast<float>(g.head_dim)); }
};

AttentionMetadata CudaBackendTest::OnDevice(const AttentionCase& c) {
  AttentionMetadata md = c.Host();
  md.seq_indptr = Up(c.seq_indptr);
  md.positions = Up(c.positions);
  md.context_lens = Up(c.context_lens);
  md.block_indptr = Up(c.block_indptr);
  md.block_indices = Up(c.blocks);
  md.slot_mapping = Up(c.slots);
  return md;
}

const std::vector<AttentionCase::Seq> kMixedBatch = {{0, 37}, {300, 1}, {150, 20}, {700, 1}, {5, 3}};

TEST_F(CudaBackendTest, PagedAttentionMatches) {
  // head_dim 80 takes the one-block-per-head kernel; the others the split-KV ones, with one head
  // chunk (8 and 7 query heads per KV head) or two (16 per KV head at head_dim 256).
  for (int64_t hd : {32, 64, 80, 128, 256}) {
    for (auto [hq, kvh] : std::vector<std::pair<int64_t, int64_t>>{{8, 2}, {16, 2}, {7, 1}}) {
      AttentionCase c(hd, hq, kvh, kMixedBatch);
      const size_t cache_elems = c.g.num_layers * c.g.elements_per_layer();
      float *kcg = Up(c.kc), *vcg = Up(c.vc), *out = Zeros(c.n * hq * hd);
      const AttentionMetadata md = OnDevice(c);
      gpu_->PagedAttention(Up(c.q), Up(c.k), Up(c.v), kcg, vcg, c.g, c.layer, md, hq, c.scale(), out);
      std::vector<float> ref(c.n * hq * hd), kc = c.kc, vc = c.vc;
      cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), kc.data(), vc.data(), c.g, c.layer, c.Host(), hq,
                           c.scale(), ref.data());
      EXPECT_LE(MaxRelDiff(Down(out, ref.size()), ref), 1e-4f) << "head_dim " << hd << ", heads " << hq << "/" << kvh;
      EXPECT_EQ(Down(kcg, cache_elems), kc) << "K cache writes, head_dim " << hd;
      EXPECT_EQ(Down(vcg, cache_elems), vc) << "V cache writes, head_dim " << hd;
    }
  }
}

// The q|k|v prologue kernel (split, q/k norms, RoPE, cache write in one pass): the bits of the ops it
// replaces (Backend's own QkvAttention: CopyColumns, RmsNorm, Rope, PagedAttention), output and both
// caches, over the mixed batch with a padding token (slot -1) and over a single token, with and without
// Qwen3's norms, over f32 and BF16 caches; and within rounding of the CPU.
// With the projection in its input (proj 1: Linear, 2: RmsNormLinear with a bias), over BF16 weights:
// on a BF16 cache and up to 8 tokens the q|k|v GEMV's last blocks run the prologue (their counters
// reused case after case), elsewhere the projection then the prologue kernel; the same bits as the
// projection op followed by the ops the prologue replaces.
TEST_F(CudaBackendTest, QkvPrologueGivesTheBitsOfTheOpsItReplaces) {
  const std::vector<AttentionCase::Seq> kEightTokens = {{300, 1}, {10, 1}, {40, 2}, {700, 1}, {5, 3}};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t hd : {64, 80, 128}) {
      for (int batch : {0, 1, 2}) {  // the mixed batch, one token, eight tokens
      for (int proj : {0, 1, 2}) {
        for (bool norms : {false, true}) {
          if (batch == 0 && proj == 2) continue;  // cuBLAS: no norm prologue
          const bool single = batch == 1;
          const int64_t hq = 8, hk = 2;
          AttentionCase c(hd, hq, hk, single ? std::vector<AttentionCase::Seq>{{300, 1}} : batch == 0 ? kMixedBatch
                                                                                                    : kEightTokens);
          c.g.dtype = dt;
          if (!single) c.slots[3] = -1;  // a padding token: rotated, not stored
          const int64_t row = (hq + 2 * hk) * hd, kin = 64;
          const std::vector<float> qkv = Random(c.n * row, 61), qn = Random(hd, 62), kn = Random(hd, 63);
          const std::vector<float> x = Random(c.n * kin, 64), wf = Random(row * kin, 65), bias = Random(row, 66),
                                   xn = Random(kin, 67);
          const DeviceWeight ww = gpu_->UploadWeight(View(wf, row, kin, DType::kBF16)).value();
          const DeviceWeight bw = gpu_->UploadWeight(View(bias, 1, row, DType::kF32)).value();
          const DeviceWeight nw = gpu_->UploadWeight(View(xn, 1, kin, DType::kF32)).value();
          std::vector<float> inv(hd / 2);
          for (int64_t i = 0; i < hd / 2; ++i) inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / hd));
          const DeviceWeight qw = gpu_->UploadWeight(View(qn, 1, hd, DType::kF32)).value();
          const DeviceWeight kw = gpu_->UploadWeight(View(kn, 1, hd, DType::kF32)).value();
          const size_t elems = c.g.num_layers * c.g.elements_per_layer(), cache_bytes = elems * DTypeSize(dt);
          std::vector<std::byte> cache_init(cache_bytes);
          for (size_t i = 0; i < cache_bytes; ++i) cache_init[i] = static_cast<std::byte>(i * 7 % 61);
          const AttentionMetadata md = OnDevice(c);
          struct Run {
            std::vector<float> out;
            std::vector<std::byte> kc, vc;
          };
          auto run = [&](bool fused) {
            Backend::QkvAttentionInput in;
            in.qkv = Up(qkv);
            if (proj > 0) {
              in.x = Up(x);
              in.w = &ww;
              in.bias = proj == 2 ? &bw : nullptr;
              in.norm = proj == 2 ? &nw : nullptr;
              in.h = Zeros(c.n * kin);
              in.scratch = Zeros(c.n * row);
            }
            if (norms) {
              in.q_norm = &qw;
              in.k_norm = &kw;
            }
            in.eps = 1e-6f;
            in.inv_freq = Up(inv);
            in.q = Zeros(c.n * hq * hd);
            in.k = Zeros(c.n * hk * hd);
            in.v = Zeros(c.n * hk * hd);
            float* out = Zeros(c.n * hq * hd);
            void *kc = Up(cache_init), *vc = Up(cache_init);
            if (fused) {
              gpu_->QkvAttention(in, kc, vc, c.g, c.layer, md, hq, c.scale(), out);
            } else {
              gpu_->Backend::QkvAttention(in, kc, vc, c.g, c.layer, md, hq, c.scale(), out);
            }
            Run r{Down(out, c.n * hq * hd), std::vector<std::byte>(cache_bytes), std::vector<std::byte>(cache_bytes)};
            gpu_->CopyToHost(r.kc.data(), kc, cache_bytes);
            gpu_->CopyToHost(r.vc.data(), vc, cache_bytes);
            return r;
          };
          const Run a = run(false), b = run(true);
          const std::string what = absl::StrCat(std::string(DTypeName(dt)), " head_dim ", hd,
                                                batch == 1 ? " one token" : batch == 2 ? " eight tokens" : "",
                                                norms ? " with q/k norms" : "", proj == 1 ? ", projected" : "",
                                                proj == 2 ? ", normalised, projected with a bias" : "");
          EXPECT_EQ(b.out, a.out) << what;
          EXPECT_TRUE(b.kc == a.kc) << "K cache, " << what;
          EXPECT_TRUE(b.vc == a.vc) << "V cache, " << what;
          EXPECT_FALSE(a.kc == cache_init) << "keys written, " << what;
          // The CPU's own ops (an f32 cache: the CPU's 16-bit cache is checked elsewhere).
          if (dt != DType::kF32 || proj > 0) continue;
          const DeviceWeight qc = cpu_->UploadWeight(View(qn, 1, hd, DType::kF32)).value();
          const DeviceWeight kcw = cpu_->UploadWeight(View(kn, 1, hd, DType::kF32)).value();
          std::vector<float> qkv_c = qkv, qb(c.n * hq * hd), kb(c.n * hk * hd), vb(c.n * hk * hd), ref(c.n * hq * hd);
          std::vector<float> kc_c(elems), vc_c(elems);
          std::memcpy(kc_c.data(), cache_init.data(), cache_bytes);
          std::memcpy(vc_c.data(), cache_init.data(), cache_bytes);
          Backend::QkvAttentionInput in;
          in.qkv = qkv_c.data();
          if (norms) {
            in.q_norm = &qc;
            in.k_norm = &kcw;
          }
          in.eps = 1e-6f;
          in.inv_freq = inv.data();
          in.q = qb.data();
          in.k = kb.data();
          in.v = vb.data();
          cpu_->QkvAttention(in, kc_c.data(), vc_c.data(), c.g, c.layer, c.Host(), hq, c.scale(), ref.data());
          EXPECT_LE(MaxRelDiff(b.out, ref), 1e-4f) << what;
        }
      }
      }
    }
  }
  cuda::QkvPrologueArgs bad;
  bad.num_tokens = 1;
  bad.num_q_heads = 8;
  bad.layer.num_kv_heads = 2;
  bad.layer.head_dim = cuda::kMaxPrologueHeadDim + 2;
  EXPECT_EQ(cuda::LaunchQkvPrologue(bad, nullptr), cudaErrorInvalidValue);
  bad.layer.head_dim = 63;
  EXPECT_EQ(cuda::LaunchQkvPrologue(bad, nullptr), cudaErrorInvalidValue);
}

// Every attention kernel writes its output rounded for the o projection's GEMM too (RoundOutput): a
// step of prompt chunks (the tiled kernel, or with TANDEM_CUDA_TC_ATTENTION its tensor-core twin, with
// the split-KV kernel for the decode token beside them) then the GEMM: the bits of a GEMM over a
// fresh copy of the output.
TEST_F(CudaBackendTest, AttentionWritesTheOProjectionsInputRounded) {
  for (bool tc : {false, true}) {
    if (tc) ::setenv("TANDEM_CUDA_TC_ATTENTION", "1", 1);
    auto backend = CudaBackend::Create({});
    ::unsetenv("TANDEM_CUDA_TC_ATTENTION");
    ASSERT_TRUE(backend.ok()) << backend.status();
    CudaBackend* b = backend->get();
    AttentionCase c(64, 8, 2, {{0, 80}, {300, 1}, {40, 70}});
    c.g.dtype = DType::kBF16;
    const int64_t d = c.hq * 64, m = 96;
    const DeviceWeight w = b->UploadWeight(View(Random(m * d, 81, 0.05f), m, d, DType::kBF16)).value();
    // Buffers from the fixture's backend (one device, uploads finished on return); b reads them back
    // on its own stream, after its work.
    std::vector<uint16_t> cache(c.g.num_layers * c.g.elements_per_layer());
    for (size_t i = 0; i < cache.size(); ++i) cache[i] = F32ToBf16(c.kc[i]);
    float *attn = Zeros(c.n * d), *out = Zeros(c.n * m);
    b->PagedAttention(Up(c.q), Up(c.k), Up(c.v), Up(cache), Up(cache), c.g, c.layer, OnDevice(c), c.hq, c.scale(),
                      attn);
    b->Linear(attn, c.n, w, nullptr, out);
    std::vector<float> got(c.n * m), a(c.n * d), ref(c.n * m);
    b->CopyToHost(got.data(), out, got.size() * 4);
    b->CopyToHost(a.data(), attn, a.size() * 4);
    b->Linear(Up(a), c.n, w, nullptr, out);
    b->CopyToHost(ref.data(), out, ref.size() * 4);
    EXPECT_EQ(got, ref) << (tc ? "tensor-core" : "tiled") << " prompt kernel";
    EXPECT_TRUE(b->CheckErrors().ok());
  }
}

// A BF16 or F16 cache: keys and values written rounded to nearest even, exactly as the CPU rounds
// them, and attention over them within f32 rounding of the CPU's.
TEST_F(CudaBackendTest, PagedAttentionOverA16BitCacheMatchesTheCpu) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int64_t hd : {64, 80, 128}) {
      AttentionCase c(hd, 8, 2, kMixedBatch);
      c.g.dtype = dt;
      const size_t cache_elems = c.g.num_layers * c.g.elements_per_layer();
      std::vector<uint16_t> kc(cache_elems), vc(cache_elems);
      for (size_t i = 0; i < cache_elems; ++i) {
        kc[i] = dt == DType::kBF16 ? F32ToBf16(c.kc[i]) : F32ToF16(c.kc[i]);
        vc[i] = dt == DType::kBF16 ? F32ToBf16(c.vc[i]) : F32ToF16(c.vc[i]);
      }
      uint16_t *kcg = Up(kc), *vcg = Up(vc);
      float* out = Zeros(c.n * c.hq * hd);
      gpu_->PagedAttention(Up(c.q), Up(c.k), Up(c.v), kcg, vcg, c.g, c.layer, OnDevice(c), c.hq, c.scale(), out);
      std::vector<float> ref(c.n * c.hq * hd);
      cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), kc.data(), vc.data(), c.g, c.layer, c.Host(), c.hq,
                           c.scale(), ref.data());
      EXPECT_LE(MaxRelDiff(Down(out, ref.size()), ref), 1e-4f) << DTypeName(dt) << " head_dim " << hd;
      std::vector<uint16_t> k_back(cache_elems), v_back(cache_elems);
      gpu_->CopyToHost(k_back.data(), kcg, cache_elems * 2);
      gpu_->CopyToHost(v_back.data(), vcg, cache_elems * 2);
      EXPECT_EQ(k_back, kc) << "K cache writes, " << DTypeName(dt) << " head_dim " << hd;
      EXPECT_EQ(v_back, vc) << "V cache writes, " << DTypeName(dt) << " head_dim " << hd;
    }
  }
}

// The tiled prompt kernel against the CPU: long prompt chunks over cached prefixes, tiles that span
// sequences, a decode token among them; a first tile of five runs with sequences of no new tokens
// between them; in f32, BF16 and F16 caches. The backend's own launch (kAuto, not batch-invariant)
// takes it for such a step's long sequences and the split-KV kernel for the short ones.
TEST_F(CudaBackendTest, TiledPrefillAttentionMatchesTheCpu) {
  const std::vector<std::vector<AttentionCase::Seq>> batches = {
      {{0, 150}, {40, 90}, {300, 70}, {700, 1}, {5, 3}},
      {{10, 5}, {0, 0}, {0, 7}, {260, 30}, {3, 9}, {40, 0}, {0, 40}}};
  int case_index = -1;
  for (const auto& prompts : batches)
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t hd : {32, 64, 128, 256}) {
      for (auto [hq, kvh] : std::vector<std::pair<int64_t, int64_t>>{{8, 2}, {7, 7}}) {
        // Emulated: every fifth case, which takes both batches, every dtype, head_dim and head
        // layout, and the tensor-core kernel over both 16-bit caches.
        if (++case_index % 5 != 0 && kEmulated) continue;
        AttentionCase c(hd, hq, kvh, prompts);
        c.g.dtype = dt;
        const size_t cache_elems = c.g.num_layers * c.g.elements_per_layer();
        // Both caches as the dtype stores them.
        std::vector<uint16_t> k16(cache_elems), v16(cache_elems);
        for (size_t i = 0; i < cache_elems && dt != DType::kF32; ++i) {
          k16[i] = dt == DType::kBF16 ? F32ToBf16(c.kc[i]) : F32ToF16(c.kc[i]);
          v16[i] = dt == DType::kBF16 ? F32ToBf16(c.vc[i]) : F32ToF16(c.vc[i]);
        }
        void* kc_host = dt == DType::kF32 ? static_cast<void*>(c.kc.data()) : k16.data();
        void* vc_host = dt == DType::kF32 ? static_cast<void*>(c.vc.data()) : v16.data();
        const auto up_cache = [&](const std::vector<float>& f, const std::vector<uint16_t>& h) -> void* {
          return dt == DType::kF32 ? static_cast<void*>(Up(f)) : static_cast<void*>(Up(h));
        };
        void *kcg = up_cache(c.kc, k16), *vcg = up_cache(c.vc, v16);
        const AttentionMetadata md = OnDevice(c);
        const float *qg = Up(c.q), *kg = Up(c.k), *vg = Up(c.v);
        cuda::PagedAttentionArgs a = CudaBackend::AttentionArgs(qg, kg, vg, kcg, vcg, c.g, c.layer, md, hq, c.scale(),
                                                                Zeros(c.n * hq * hd));
        a.mode = cuda::AttentionMode::kTiled;
        ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> tiled = Down(a.out, c.n * hq * hd);
        std::vector<float> ref(c.n * hq * hd);
        cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), kc_host, vc_host, c.g, c.layer, c.Host(), hq, c.scale(),
                             ref.data());
        EXPECT_LE(MaxRelDiff(tiled, ref), 1e-4f) << DTypeName(dt) << " head_dim " << hd << " heads " << hq << "/" << kvh;
        // The split-KV kernel's own result, for the short sequences the backend leaves to it.
        a.mode = cuda::AttentionMode::kInBlock;
        a.out = Zeros(c.n * hq * hd);
        ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> split = Down(a.out, c.n * hq * hd);
        ASSERT_TRUE(cuda::TiledPrefillPays(a));
        float* out = Zeros(c.n * hq * hd);
        gpu_->PagedAttention(qg, kg, vg, kcg, vcg, c.g, c.layer, md, hq, c.scale(), out);
        const std::vector<float> got = Down(out, c.n * hq * hd);
        EXPECT_LE(MaxRelDiff(got, ref), 1e-4f) << "kAuto, " << DTypeName(dt) << " head_dim " << hd;
        // kAuto: sequences of at least kMinTiledNewTokens new tokens tiled, the others split-KV.
        const size_t row = static_cast<size_t>(hq * hd);
        for (size_t s = 0; s + 1 < c.seq_indptr.size(); ++s) {
          const bool tiled_seq = c.seq_indptr[s + 1] - c.seq_indptr[s] >= cuda::kMinTiledNewTokens;
          const std::vector<float>& want = tiled_seq ? tiled : split;
          for (int32_t t = c.seq_indptr[s]; t < c.seq_indptr[s + 1]; ++t) {
            EXPECT_TRUE(std::equal(got.begin() + t * row, got.begin() + (t + 1) * row, want.begin() + t * row))
                << "token " << t << " (sequence " << s << ") not from the " << (tiled_seq ? "tiled" : "split-KV")
                << " kernel: " << DTypeName(dt) << " head_dim " << hd;
          }
        }
        // The tensor-core prompt kernel (16-bit caches, head_dim 64 and 128): queries and probabilities
        // rounded to the cache's type, so within BF16's (F16's) rounding of the CPU; and kAuto with it
        // on partitions the tokens the same way.
        cuda::PagedAttentionArgs tc = a;
        tc.mode = cuda::AttentionMode::kTensorCore;
        tc.out = Zeros(c.n * hq * hd);
        if (!cuda::TensorCorePrefillCapable(tc)) {
          EXPECT_EQ(cuda::LaunchPagedAttention(tc, nullptr), cudaErrorInvalidValue) << DTypeName(dt) << " " << hd;
          continue;
        }
        ASSERT_EQ(cuda::LaunchPagedAttention(tc, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> tensor = Down(tc.out, c.n * hq * hd);
        // (A model of the kernel's rounding on these inputs: 5.2e-3 in BF16, 6.6e-4 in F16; an off-by-one
        // mask, a missing rescale or a dropped key tile: 0.75 and more.)
        EXPECT_LE(MaxRelDiff(tensor, ref), dt == DType::kBF16 ? 2e-2f : 4e-3f)
            << "tensor cores, " << DTypeName(dt) << " head_dim " << hd << " heads " << hq << "/" << kvh;
        tc.mode = cuda::AttentionMode::kAuto;
        tc.allow_tiled = true;  // as CudaBackend::PagedAttention sets it outside the batch-invariant mode
        tc.tensor_core_prefill = true;
        tc.out = Zeros(c.n * hq * hd);
        ASSERT_EQ(cuda::LaunchPagedAttention(tc, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> auto_tc = Down(tc.out, c.n * hq * hd);
        for (size_t s = 0; s + 1 < c.seq_indptr.size(); ++s) {
          const bool tiled_seq = c.seq_indptr[s + 1] - c.seq_indptr[s] >= cuda::kMinTiledNewTokens;
          const std::vector<float>& want = tiled_seq ? tensor : split;
          for (int32_t t = c.seq_indptr[s]; t < c.seq_indptr[s + 1]; ++t) {
            EXPECT_TRUE(std::equal(auto_tc.begin() + t * row, auto_tc.begin() + (t + 1) * row, want.begin() + t * row))
                << "token " << t << " (sequence " << s << ") not from the "
                << (tiled_seq ? "tensor-core" : "split-KV") << " kernel: " << DTypeName(dt) << " head_dim " << hd;
          }
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, SplitKvAttentionIsBitIdenticalInEveryModeAndBatch) {
  for (int64_t hd : {32, 64, 128, 256}) {
    AttentionCase c(hd, 16, 2, kMixedBatch);
    const AttentionMetadata md = OnDevice(c);
    cuda::PagedAttentionArgs a = CudaBackend::AttentionArgs(Up(c.q), Up(c.k), Up(c.v), Up(c.kc), Up(c.vc), c.g, c.layer,
                                                            md, c.hq, c.scale(), nullptr);
    std::map<std::string, std::vector<float>> outs;
    float* batch_workspace = nullptr;
    int64_t batch_workspace_floats = 0;
    for (auto [name, mode] : std::vector<std::pair<std::string, cuda::AttentionMode>>{
             {"in-block", cuda::AttentionMode::kInBlock}, {"grid-split", cuda::AttentionMode::kGridSplit}}) {
      a.mode = mode;
      a.workspace_floats = cuda::SplitAttentionWorkspaceFloats(a);
      a.workspace = a.workspace_floats > 0 ? Zeros(a.workspace_floats) : nullptr;
      if (a.workspace != nullptr) batch_workspace = a.workspace, batch_workspace_floats = a.workspace_floats;
      a.out = Zeros(c.n * c.hq * hd);
      ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess) << name;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      outs[name] = Down(a.out, c.n * c.hq * hd);
      // Again over the same workspace: the split blocks' counters are back at zero, so the last block
      // of each token and head merges again (a stale count would leave outputs unwritten).
      a.out = Zeros(c.n * c.hq * hd);
      ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess) << name;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(Down(a.out, c.n * c.hq * hd), outs[name]) << name << ", launched again, head_dim " << hd;
    }
    ASSERT_GT(cuda::SplitAttentionWorkspaceFloats(a), 0) << "the grid-split case must really split";
    EXPECT_EQ(outs["in-block"], outs["grid-split"]) << "head_dim " << hd;
    // The 700-token decode alone (token 58 of the batch, sequence 3): the same bits as in the batch.
    const int64_t t = c.seq_indptr[3];
    std::vector<int32_t> table(c.blocks.begin() + c.block_indptr[3], c.blocks.begin() + c.block_indptr[4]);
    a.num_tokens = 1;
    a.num_seqs = 1;
    a.max_context_len = 701;
    a.seq_indptr = Up(std::vector<int32_t>{0, 1});
    a.positions = Up(std::vector<int32_t>{c.positions[t]});
    a.context_lens = Up(std::vector<int32_t>{701});
    a.block_indptr = Up(std::vector<int32_t>{0, static_cast<int32_t>(table.size())});
    a.block_indices = Up(table);
    a.slot_mapping = Up(std::vector<int32_t>{c.slots[t]});
    const size_t row = c.hq * hd, kv_row = c.g.num_kv_heads * hd;
    a.q = Up(std::vector<float>(c.q.begin() + t * row, c.q.begin() + (t + 1) * row));
    a.k = Up(std::vector<float>(c.k.begin() + t * kv_row, c.k.begin() + (t + 1) * kv_row));
    a.v = Up(std::vector<float>(c.v.begin() + t * kv_row, c.v.begin() + (t + 1) * kv_row));
    for (cuda::AttentionMode mode : {cuda::AttentionMode::kAuto, cuda::AttentionMode::kInBlock, cuda::AttentionMode::kGridSplit}) {
      a.mode = mode;
      // The batch's workspace again, as the backend reuses its scratch: this launch's partials and
      // counters lie where the batch's partials were.
      a.workspace_floats = cuda::SplitAttentionWorkspaceFloats(a);
      ASSERT_LE(a.workspace_floats, batch_workspace_floats);
      a.workspace = a.workspace_floats > 0 ? batch_workspace : nullptr;
      a.out = Zeros(row);
      ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(Down(a.out, row), std::vector<float>(outs["in-block"].begin() + t * row, outs["in-block"].begin() + (t + 1) * row))
          << "head_dim " << hd << ", mode " << static_cast<int>(mode);
    }
  }
}

// Grid splits shorter than the in-block 256 keys (PagedAttentionArgs::grid_split_keys): the CPU's
// results within rounding for every length (the batch's contexts of 1 to 701 keys cross many split
// boundaries), relaunched over the same workspace; past kMaxGridSplits splits the keys double; a value
// the kernel does not take is refused with nothing written; the backend's variable reaches the launch.
TEST_F(CudaBackendTest, ShorterGridSplitsMatchTheCpu) {
  for (int64_t hd : {64, 128}) {
    AttentionCase c(hd, 16, 2, kMixedBatch);
    const AttentionMetadata md = OnDevice(c);
    std::vector<float> ref(c.n * c.hq * hd), kc = c.kc, vc = c.vc;
    cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), kc.data(), vc.data(), c.g, c.layer, c.Host(), c.hq,
                         c.scale(), ref.data());
    cuda::PagedAttentionArgs a = CudaBackend::AttentionArgs(Up(c.q), Up(c.k), Up(c.v), Up(c.kc), Up(c.vc), c.g, c.layer,
                                                            md, c.hq, c.scale(), nullptr);
    a.mode = cuda::AttentionMode::kGridSplit;
    for (int64_t keys : {32, 64, 128}) {
      a.grid_split_keys = keys;
      a.workspace_floats = cuda::SplitAttentionWorkspaceFloats(a);
      // 701 keys: 22, 11 and 6 splits of each token's (token, KV head) blocks.
      ASSERT_EQ(a.workspace_floats, 4096 + c.n * c.hq * ((701 + keys - 1) / keys) * (hd + 2)) << keys;
      a.workspace = Zeros(a.workspace_floats);
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        a.out = Zeros(c.n * c.hq * hd);
        ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess) << keys;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> out = Down(a.out, ref.size());
        EXPECT_LE(MaxRelDiff(out, ref), 1e-4f) << "head_dim " << hd << ", splits of " << keys << " keys, run " << run;
        if (run == 0) first = out;
        else EXPECT_EQ(out, first) << "relaunched over the same workspace, splits of " << keys << " keys";
      }
    }
    // 5000 keys in splits of 32 would be 157: the keys double to 128 (40 splits), the workspace says so.
    cuda::PagedAttentionArgs long_context = a;
    long_context.grid_split_keys = 32;
    long_context.max_context_len = 5000;
    EXPECT_EQ(cuda::SplitAttentionWorkspaceFloats(long_context), 4096 + c.n * c.hq * 40 * (hd + 2));
    a.grid_split_keys = 48;
    EXPECT_EQ(cuda::SplitAttentionWorkspaceFloats(a), 0);
    a.out = Zeros(c.n * c.hq * hd);
    EXPECT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(Down(a.out, ref.size()), std::vector<float>(ref.size(), 0.f)) << "nothing written";
  }
  // Through the backend: TANDEM_CUDA_GRID_SPLIT_KEYS=64 splits a lone 701-key decode into 11 blocks'
  // worth of partials (other bits than 256-key splits, the same values within rounding).
  AttentionCase c(128, 16, 2, {{700, 1}});
  ::setenv("TANDEM_CUDA_GRID_SPLIT_KEYS", "64", 1);
  auto short_splits = CudaBackend::Create({});
  ::unsetenv("TANDEM_CUDA_GRID_SPLIT_KEYS");
  ASSERT_TRUE(short_splits.ok()) << short_splits.status();
  EXPECT_NE((*short_splits)->device_description().find("grid splits of 64 keys"), std::string::npos);
  std::vector<float> ref(c.n * c.hq * 128), kc = c.kc, vc = c.vc;
  cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), kc.data(), vc.data(), c.g, c.layer, c.Host(), c.hq,
                       c.scale(), ref.data());
  const AttentionMetadata md = OnDevice(c);
  std::map<std::string, std::vector<float>> outs;
  for (auto [name, backend] : std::vector<std::pair<std::string, CudaBackend*>>{{"64", short_splits->get()},
                                                                               {"256", gpu_.get()}}) {
    float* out = Zeros(ref.size());
    backend->PagedAttention(Up(c.q), Up(c.k), Up(c.v), Up(c.kc), Up(c.vc), c.g, c.layer, md, c.hq, c.scale(), out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the other backend's stream, then this one's copy
    ASSERT_TRUE(backend->CheckErrors().ok()) << backend->CheckErrors();
    outs[name] = Down(out, ref.size());
    EXPECT_LE(MaxRelDiff(outs[name], ref), 1e-4f) << "splits of " << name << " keys through the backend";
  }
  EXPECT_NE(outs["64"], outs["256"]) << "TANDEM_CUDA_GRID_SPLIT_KEYS=64 did not reach the launch";
}

TEST_F(CudaBackendTest, ArgmaxRowsMatchesTheCpu) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t d = 151936;  // Qwen 2.5's vocabulary: many elements per thread
  std::vector<float> x = Random(6 * d, 31);
  x[0 * d + 70000] = x[0 * d + 150000] = x[0 * d + 5] = 50.f;  // ties: the lowest id wins
  for (int64_t j = 0; j < d; ++j) x[1 * d + j] = j % 3 == 0 ? nan : x[1 * d + j];
  x[1 * d + 999] = 60.f;
  for (int64_t j = 0; j < d; ++j) x[2 * d + j] = -inf;
  for (int64_t j = 0; j < d; ++j) x[3 * d + j] = nan;
  x[4 * d + d - 1] = inf;
  std::vector<int32_t> ref(6);
  cpu_->ArgmaxRows(x.data(), 6, d, ref.data());
  auto ids = gpu_->Allocate(6 * sizeof(int32_t)).value();
  gpu_->ArgmaxRows(Up(x), 6, d, static_cast<int32_t*>(ids->data()));
  std::vector<int32_t> got(6);
  gpu_->CopyToHost(got.data(), ids->data(), 6 * sizeof(int32_t));
  EXPECT_EQ(got, ref);
  EXPECT_EQ(ref[0], 5);
  EXPECT_EQ(ref[1], 999);
  EXPECT_EQ(ref[2], 0);
  EXPECT_EQ(ref[3], 0);
  EXPECT_EQ(ref[4], d - 1);
}

// Top-k candidates on the device (radix select, then a bitonic sort) against a plain sort (value,
// then lower id; NaN as -inf; -0 equal to +0), on a Qwen-sized vocabulary and a small one, for k from 1
// to 256 and per-row k (0 skips a row, leaving its outputs alone): rows with ties around the cut, NaN,
// an -inf tail, +inf, signed zeros and a row of one value. The sampler finishing from the candidates
// gives the token it gives from the whole row.
// The engine sampling where the logits are (every kind of step) against the same engine on the same
// GPU sampling on the host (EngineOptions::device_sampling false), over a tiny F32 model: greedy (with a
// penalty) and top-k requests give the host's tokens exactly, and logprobs within 1e-5; top-p, min-p
// and temperature requests (the device's expf and sums round differently) the host's tokens in nearly
// every request.
TEST_F(CudaBackendTest, EngineSamplingOnTheDeviceMatchesTheHostSampler) {
  auto model = LlamaModel::Load(testing_util::TinyModel("tiny-qwen2", 3, DType::kF32), gpu_.get()).value();
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float repetition;
    int32_t logprobs;
    bool exact;
  };
  const std::vector<Case> cases = {{0.f, 0, 1.f, 0.f, 1.3f, -1, true},   {0.8f, 20, 1.f, 0.f, 1.f, -1, true},
                                   {0.8f, 40, 0.9f, 0.05f, 1.2f, -1, true}, {1.f, 10, 1.f, 0.f, 1.f, 3, true},
                                   {1.f, 0, 0.9f, 0.f, 1.f, -1, false},  {0.3f, 0, 0.5f, 0.f, 1.f, -1, false},
                                   {1.f, 0, 1.f, 0.f, 1.f, -1, false},   {0.7f, 0, 1.f, 0.1f, 1.f, 2, false}};
  std::vector<EngineRequest> reqs;
  std::mt19937 rng(5);
  for (int i = 0; i < 32; ++i) {
    const Case& c = cases[i % cases.size()];
    EngineRequest r;
    r.id = std::to_string(i);
    for (int t = 0; t < 5 + i * 3; ++t) r.prompt_token_ids.push_back(static_cast<int32_t>(rng() % 500));
    r.params.temperature = c.temperature;
    r.params.top_k = c.top_k;
    r.params.top_p = c.top_p;
    r.params.min_p = c.min_p;
    r.params.repetition_penalty = c.repetition;
    r.params.logprobs = c.logprobs;
    r.params.seed = 100 + i;
    r.params.max_tokens = 16;
    r.params.ignore_eos = true;
    reqs.push_back(r);
  }
  auto run = [&](bool device_sampling) {
    EngineOptions o;
    o.kv_cache_memory = int64_t{64} << 20;
    o.device_sampling = device_sampling;
    auto engine = Engine::Create(model.get(), o).value();
    for (const EngineRequest& r : reqs) EXPECT_TRUE(engine->AddRequest(r).ok());
    std::map<std::string, std::pair<std::vector<int32_t>, std::vector<LogprobEntry>>> out;
    for (int guard = 0; engine->HasWork() && guard < 10000; ++guard) {
      auto step = engine->Step();
      EXPECT_TRUE(step.ok()) << step.status();
      if (!step.ok()) break;
      for (const RequestOutput& o : *step) {
        auto& [tokens, logprobs] = out[o.id];
        tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        logprobs.insert(logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
      }
    }
    return out;
  };
  const auto host = run(false), device = run(true);
  int inexact = 0, inexact_same = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string& id = reqs[i].id;
    const Case& c = cases[i % cases.size()];
    const auto& [want, want_lp] = host.at(id);
    const auto& [got, got_lp] = device.at(id);
    ASSERT_EQ(got.size(), 16u) << id;
    if (!c.exact) {
      ++inexact;
      inexact_same += got == want;
      continue;
    }
    EXPECT_EQ(got, want) << "request " << id;
    ASSERT_EQ(got_lp.size(), want_lp.size()) << id;
    for (size_t t = 0; t < got_lp.size(); ++t) {
      EXPECT_EQ(got_lp[t].token_id, want_lp[t].token_id);
      EXPECT_EQ(got_lp[t].rank, want_lp[t].rank);
      EXPECT_NEAR(got_lp[t].logprob, want_lp[t].logprob, 1e-5) << "request " << id << " token " << t;
    }
  }
  EXPECT_GE(inexact_same, inexact - 2) << inexact_same << " of " << inexact << " top-p/temperature requests alike";
}

TEST_F(CudaBackendTest, TopKRowsMatchAPlainSortAndTheSampler) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t d : {int64_t{151936}, int64_t{300}}) {
    const int64_t n = 7;
    std::vector<float> x = Random(n * d, 33);
    for (int64_t j = 0; j < d; j += 97) x[j] = 4.f;                          // row 0: many ties around the cut
    for (int64_t j = 0; j < d; j += 3) x[1 * d + j] = nan;                  // row 1: a third NaN
    for (int64_t j = 0; j < d; ++j) x[2 * d + j] = j < d - 10 ? -inf : 1.f;  // row 2: ten finite, -inf by id
    x[3 * d + 77] = inf;                                                     // row 3: +inf first
    for (int64_t j = 0; j < d; ++j) x[4 * d + j] = j % 2 ? 0.f : -0.f;       // row 4: signed zeros, all equal
    for (int64_t j = 0; j < d; ++j) x[5 * d + j] = static_cast<float>(j % 7) - 3.f;  // row 5: 7 values
    const float* xg = Up(x);
    for (const int32_t k : {1, 40, 64, 256}) {
      // Per-row k: the full width, a smaller one, and a skipped row.
      std::vector<int32_t> row_k(static_cast<size_t>(n), k);
      row_k[5] = std::max(1, k / 3);
      row_k[6] = 0;
      std::vector<int32_t> ids(static_cast<size_t>(n * k), -7);
      std::vector<float> vals(static_cast<size_t>(n * k), 42.f);
      int32_t* ids_dev = Up(ids);
      float* vals_dev = Up(vals);
      gpu_->TopKRows(xg, n, d, k, Up(row_k), ids_dev, vals_dev);
      gpu_->CopyToHost(ids.data(), ids_dev, ids.size() * sizeof(int32_t));
      gpu_->CopyToHost(vals.data(), vals_dev, vals.size() * sizeof(float));
      for (int64_t i = 0; i < n; ++i) {
        const float* row = x.data() + i * d;
        auto key = [&](int32_t t) { return std::isnan(row[t]) ? -inf : row[t]; };
        std::vector<int32_t> order(static_cast<size_t>(d));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
        for (int32_t j = 0; j < k; ++j) {
          if (j >= row_k[i]) {  // beyond the row's own k (all of a skipped row's): left alone
            ASSERT_EQ(ids[i * k + j], -7) << "row " << i << " entry " << j;
            ASSERT_EQ(vals[i * k + j], 42.f) << "row " << i << " entry " << j;
            continue;
          }
          ASSERT_EQ(ids[i * k + j], order[j]) << "d " << d << " k " << k << " row " << i << " rank " << j;
          ASSERT_EQ(vals[i * k + j], key(order[j])) << "d " << d << " k " << k << " row " << i << " rank " << j;
        }
        if (row_k[i] < 40) continue;
        SamplingParams p;
        p.temperature = 0.9f;
        p.top_k = 40;
        p.top_p = 0.9f;
        p.seed = 7 + i;
        SequenceSampler whole(p, {}, d, {}), from_top(p, {}, d, {});
        SamplingWorkspace ws;
        EXPECT_EQ(from_top.SampleFromTopK(std::span<const int32_t>(ids.data() + i * k, k),
                                          std::span<const float>(vals.data() + i * k, k), ws),
                  whole.Sample(std::span<const float>(row, d)))
            << "row " << i;
      }
      // Without per-row k every row gets k.
      std::vector<int32_t> all_ids(static_cast<size_t>(n * k));
      int32_t* all_dev = Up(all_ids);
      gpu_->TopKRows(xg, n, d, k, nullptr, all_dev, vals_dev);
      gpu_->CopyToHost(all_ids.data(), all_dev, all_ids.size() * sizeof(int32_t));
      const float* row6 = x.data() + 6 * d;
      std::vector<int32_t> order(static_cast<size_t>(d));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row6[a] > row6[b]; });
      for (int32_t j = 0; j < k; ++j) ASSERT_EQ(all_ids[6 * k + j], order[j]) << "d " << d << " k " << k;
      for (int32_t j = 0; j < k; ++j) ASSERT_EQ(all_ids[0 * k + j], ids[0 * k + j]) << "d " << d << " k " << k;
    }
  }
}

// Logits processors as edits on the device: bit for bit the rows the host sampler processes, for
// samplers with every processor, over a batch whose rows each carry their own edits.
TEST_F(CudaBackendTest, LogitEditsMatchTheHostBitForBit) {
  const int64_t d = 151936, n = 6;
  std::vector<float> x = Random(n * d, 51, 4.f);
  x[2 * d + 5] = std::numeric_limits<float>::quiet_NaN();  // an edited NaN becomes -inf first
  std::vector<LogitEdit> edits;
  std::mt19937 rng(3);
  for (int64_t i = 0; i < n; ++i) {
    SamplingParams p;
    p.temperature = 0.8f;
    p.repetition_penalty = i % 2 ? 1.3f : 0.7f;
    p.presence_penalty = 0.4f * static_cast<float>(i % 3);
    p.frequency_penalty = -0.3f * static_cast<float>(i % 4);
    p.logit_bias = {{5, 2.5f}, {static_cast<int32_t>(1000 + i), -7.f}};
    p.min_tokens = i == 3 ? 5 : 0;
    p.stop_token_ids = {11};
    p.max_tokens = 20;
    std::vector<int32_t> prompt;
    for (int t = 0; t < 500; ++t) prompt.push_back(static_cast<int32_t>(rng() % d));
    SequenceSampler s(p, prompt, d, {2});
    for (int t = 0; t < 3; ++t) s.Accept(static_cast<int32_t>(rng() % d));
    s.Accept(5);
    s.AppendLogitEdits(static_cast<int32_t>(i), &edits);
  }
  std::vector<float> want = x;
  for (const LogitEdit& e : edits) want[e.row * d + e.token] = ApplyLogitEdit(want[e.row * d + e.token], e);
  float* xg = Up(x);
  gpu_->ApplyLogitEdits(xg, d, Up(edits), static_cast<int64_t>(edits.size()));
  std::vector<float> got(x.size());
  gpu_->CopyToHost(got.data(), xg, got.size() * sizeof(float));
  for (size_t j = 0; j < got.size(); ++j) {
    if (std::isnan(want[j]) && std::isnan(got[j])) continue;  // unedited NaN
    ASSERT_EQ(std::bit_cast<uint32_t>(got[j]), std::bit_cast<uint32_t>(want[j]))
        << "row " << j / d << " token " << j % d << ": " << got[j] << " vs " << want[j];
  }
  EXPECT_GT(edits.size(), 3000u);
}

// Weight totals and whole-row draws on the device against the host definitions (RowWeightTotal,
// DrawFromRow): totals within 5e-7 relative (the device's expf is within 2 ulp, glibc's within 1); a
// drawn token either the host's or one whose interval of the host's running sums lies within 1e-6 of
// the sum from u × sum (exp and the sums round differently on the device), and the host's in most rows.
// Rows: peaked, flat, min-p cut, NaN, all -inf, +inf, u at 0 and just below 1, min_p 1, rows asking for
// nothing; vocabularies down to 1 token (warps with empty spans).
TEST_F(CudaBackendTest, SampleRowsMatchTheHostDefinitions) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const int64_t d : {int64_t{151936}, int64_t{1000}, int64_t{33}, int64_t{1}}) {
    const int64_t n = 64;
    std::vector<float> x = Random(n * d, 61, 2.f);
    std::vector<RowDraw> draws(static_cast<size_t>(n));
    std::mt19937_64 rng(8);
    for (int64_t i = 0; i < n; ++i) {
      RowDraw& r = draws[i];
      r.mode = i % 5 == 4 ? RowDraw::kTotal : RowDraw::kDraw;
      r.inv_temperature = 1.f / (i % 3 == 0 ? 0.3f : (i % 3 == 1 ? 1.f : 2.5f));
      r.min_p = i % 4 == 1 ? 0.05f : 0.f;
      r.u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    }
    if (d > 3) x[7 * d + 3] = std::numeric_limits<float>::quiet_NaN();
    for (int64_t j = 0; j < d; ++j) x[10 * d + j] = -inf;  // row 10: nothing to weigh (token 0)
    if (d > 123) x[11 * d + 123] = inf;                     // row 11: +inf (its argmax)
    draws[10].mode = draws[11].mode = RowDraw::kDraw;
    draws[12].u = 0;                 // the first token with weight
    draws[13].u = 1 - 0x1.0p-53;     // the last
    draws[13].mode = RowDraw::kDraw;
    draws[15].min_p = 1.f;           // only the most likely tokens
    draws[15].mode = RowDraw::kDraw;
    draws[16].mode = draws[17].mode = RowDraw::kNone;  // asked for nothing: left alone
    for (int64_t j = 0; j < d; ++j) x[19 * d + j] = -inf;  // row 19: a total of nothing to weigh
    draws[19].mode = RowDraw::kTotal;
    std::vector<int32_t> tokens(static_cast<size_t>(n), -1);
    std::vector<double> totals(static_cast<size_t>(n), -1);
    int32_t* tokens_dev = Up(tokens);
    double* totals_dev = Up(totals);
    gpu_->SampleRows(Up(x), n, d, Up(draws), tokens_dev, totals_dev);
    gpu_->CopyToHost(tokens.data(), tokens_dev, tokens.size() * sizeof(int32_t));
    gpu_->CopyToHost(totals.data(), totals_dev, totals.size() * sizeof(double));
    std::vector<float> weights(static_cast<size_t>(d));
    int same = 0, draws_made = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* row = x.data() + i * d;
      const RowDraw& r = draws[i];
      if (r.mode == RowDraw::kNone) {
        EXPECT_EQ(tokens[i], -1) << "row " << i;
        EXPECT_EQ(totals[i], -1) << "row " << i;
        continue;
      }
      if (r.mode == RowDraw::kTotal) {
        const double want = RowWeightTotal(row, d, r.inv_temperature);
        EXPECT_NEAR(totals[i], want, 5e-7 * want) << "d " << d << " row " << i;
        EXPECT_EQ(tokens[i], -1) << "a total row draws nothing";
        continue;
      }
      ++draws_made;
      const int32_t want = DrawFromRow(row, d, r.inv_temperature, r.min_p, r.u, weights.data());
      if (tokens[i] == want) {
        ++same;
        continue;
      }
      ASSERT_GE(tokens[i], 0) << "row " << i;
      ASSERT_LT(tokens[i], d) << "row " << i;
      // DrawFromRow left the host's weights (min-p applied) in `weights`.
      double sum = 0, before = 0;
      for (int64_t t = 0; t < d; ++t) {
        if (t < tokens[i]) before += weights[t];
        sum += weights[t];
      }
      const double at = r.u * sum, tol = 1e-6 * sum;
      EXPECT_GT(weights[tokens[i]], 0.f) << "row " << i << ": a token of no weight";
      EXPECT_TRUE(at >= before - tol && at < before + weights[tokens[i]] + tol)
          << "d " << d << " row " << i << ": device token " << tokens[i] << ", host " << want;
    }
    EXPECT_EQ(tokens[10], 0);
    if (d > 123) {
      EXPECT_EQ(tokens[11], 123);
    }
    EXPECT_EQ(totals[19], 0);
    EXPECT_GE(same, draws_made - 2) << "d " << d;
  }
}

TEST_F(CudaBackendTest, LogprobsMatchTheSampler) {
  // Rows of a 151936-wide vocabulary: given tokens and the argmax (-1), top 5 and top 0.
  const int64_t d = 151936, n = 4;
  std::vector<float> x = Random(n * d, 41, 8.f);
  x[2 * d + 100] = x[2 * d + 200] = 30.f;  // a tie at the top: the lower id first
  const std::vector<int32_t> tokens = {7, -1, 200, 151935};
  for (int32_t top_k : {5, 0}) {
    auto region = gpu_->Allocate(static_cast<size_t>(n * (4 + 2 * top_k)) * 4).value();
    auto* r = static_cast<int32_t*>(region->data());
    gpu_->CopyToDevice(r, tokens.data(), n * sizeof(int32_t));
    gpu_->Logprobs(Up(x), n, d, r, top_k, r + n, reinterpret_cast<float*>(r + 2 * n), r + 3 * n, r + 4 * n,
                   reinterpret_cast<float*>(r + 4 * n + n * top_k));
    std::vector<int32_t> host(static_cast<size_t>(n * (4 + 2 * top_k)));
    gpu_->CopyToHost(host.data(), r, host.size() * 4);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = x.data() + i * d;
      const int32_t token = tokens[i] >= 0 ? tokens[i] : ArgmaxRow(row, d);
      const LogprobEntry e = ComputeLogprobs(row, d, token, top_k);
      float lp;
      std::memcpy(&lp, &host[2 * n + i], 4);
      EXPECT_EQ(host[n + i], e.token_id) << i;
      EXPECT_NEAR(lp, e.logprob, 1e-5f) << i;
      EXPECT_EQ(host[3 * n + i], e.rank) << i;
      for (int32_t k = 0; k < top_k; ++k) {
        float tlp;
        std::memcpy(&tlp, &host[4 * n + n * top_k + i * top_k + k], 4);
        EXPECT_EQ(host[4 * n + i * top_k + k], e.top[k].token_id) << i << " top " << k;
        EXPECT_NEAR(tlp, e.top[k].logprob, 1e-5f) << i << " top " << k;
      }
    }
  }
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
  other->PagedAttention(buf->f32(), buf->f32(), buf->f32(), buf->f32(), buf->f32(), g, 0, md, 1, 1.f, buf->f32());
  const absl::Status s = other->CheckErrors();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("paged attention"), std::string_view::npos) << s;
}

// --- The whole forward pass ---

class CudaForwardTest : public ::testing::TestWithParam<std::string> {};

// Kernels the emulator has run so far (0 on a device, where nothing counts them).
uint64_t KernelsRun() {
#ifdef TANDEM_CUDA_EMULATED
  return tandem_emu::KernelsRun();
#else
  return 0;
#endif
}

// Prefill in chunks of 16 then 8 single-token decode steps; logits of every row. `kernels` (nullable):
// the kernels each step ran, on the emulator.
std::vector<float> AllLogits(Backend* backend, const std::string& dir, const std::vector<int32_t>& tokens,
                             std::vector<uint64_t>* kernels = nullptr, DType kv_dtype = DType::kF32) {
  auto model = LlamaModel::Load(dir, backend);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  auto kv = KvCacheStorage::Create(backend, (*model)->KvGeometry(16, 16, kv_dtype)).value();
  std::vector<int32_t> table = {7, 3, 11, 0, 5};
  std::vector<float> all, step;
  size_t begin = 0;
  while (begin < tokens.size()) {
    const size_t end = begin < 40 ? std::min<size_t>(begin + 16, 40) : begin + 1;
    ForwardInput in;
    in.token_ids.assign(tokens.begin() + begin, tokens.begin() + end);
    in.seqs.push_back({static_cast<int64_t>(end - begin), static_cast<int64_t>(begin), table});
    for (size_t i = 0; i < end - begin; ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
    const uint64_t before = KernelsRun();
    const absl::Status s = (*model)->Forward(in, kv.get(), &step);
    EXPECT_TRUE(s.ok()) << s;
    if (kernels != nullptr) kernels->push_back(KernelsRun() - before);
    all.insert(all.end(), step.begin(), step.end());
    begin = end;
  }
  return all;
}

// `dtype`: the checkpoint's; `compute`: the GPU's compute type (unset: the checkpoint's).
void CompareModels(const std::string& preset, DType dtype, std::optional<DType> compute = std::nullopt,
                   bool split_inputs = false) {
  const std::string dir = testing_util::TinyModel(preset, 7, dtype);
  auto cpu = CpuBackend::Create({}).value();
  CudaBackend::Options options;
  options.compute_dtype = compute;
  options.split_gemm_inputs = split_inputs;
  auto gpu = CudaBackend::Create(options).value();
  const int64_t vocab = LlamaModel::Load(dir, cpu.get()).value()->config().vocab_size;
  std::vector<int32_t> tokens(48);
  std::mt19937 rng(3);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  const auto a = AllLogits(cpu.get(), dir, tokens), b = AllLogits(gpu.get(), dir, tokens);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), tokens.size() * vocab);
  float max_logit_diff = 0, max_dp = 0;
  int clear_rows = 0;
  for (size_t r = 0; r < tokens.size(); ++r) {
    const float* x = a.data() + r * vocab;
    const float* y = b.data() + r * vocab;
    const float mx = *std::max_element(x, x + vocab), my = *std::max_element(y, y + vocab);
    double sx = 0, sy = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      sx += std::exp(x[i] - mx);
      sy += std::exp(y[i] - my);
      max_logit_diff = std::max(max_logit_diff, std::fabs(x[i] - y[i]));
    }
    for (int64_t i = 0; i < vocab; ++i) {
      max_dp = std::max(max_dp, static_cast<float>(std::fabs(std::exp(x[i] - mx) / sx - std::exp(y[i] - my) / sy)));
    }
    std::vector<float> sorted(x, x + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const int64_t top_x = std::max_element(x, x + vocab) - x, top_y = std::max_element(y, y + vocab) - y;
    const float margin = sorted[0] - sorted[1];
    if (margin > (dtype == DType::kF32 ? 1e-3f : 0.1f)) {
      ++clear_rows;
      EXPECT_EQ(top_x, top_y) << preset << " row " << r << " margin " << margin;
    }
  }
  const std::string computed =
      absl::StrCat(compute.has_value() ? absl::StrCat(" computed in ", std::string(DTypeName(*compute))) : "",
                   split_inputs ? ", GEMM inputs split" : "");
  std::printf("%s %s%s: max |Δlogit| %.3g, max |Δp| %.3g, top-1 checked on %d of %zu rows\n", preset.c_str(),
              std::string(DTypeName(dtype)).c_str(), computed.c_str(), max_logit_diff, max_dp, clear_rows,
              tokens.size());
  if (dtype == DType::kF32) {
    EXPECT_LE(max_logit_diff, 2e-3f) << preset;
  }
  // In BF16 the GPU rounds each GEMM's activations to BF16 (tensor cores), the CPU keeps them in f32
  // against the same BF16 weights: on these small random models with peaked distributions that parts
  // the probabilities by up to ~1.7e-2 (seen on an H200). The 1e-2 bound against transformers in BF16,
  // which rounds where the GPU does, is checked by tests/gpu/hf_forward_check.py.
  // In F16 (an F16 checkpoint, or BF16 weights cast to F16) activations keep 11 significant bits to
  // BF16's 8: about 1e-3 here (emulated). Split into two 16-bit terms they keep about 16, and the
  // GPU is as close to the CPU as in F32: about 1e-5 (emulated).
  const bool f16 = compute.value_or(dtype) == DType::kF16;
  EXPECT_LE(max_dp, dtype == DType::kF32 ? 1e-2f : split_inputs ? 1e-4f : f16 ? 5e-3f : 3e-2f) << preset;
  EXPECT_TRUE(gpu->CheckErrors().ok());
}

// Five prompts of 300 to 900 tokens (emulated: 16 to 64, and 780), up to four 256-key attention
// splits; then decode steps of all five (a graph batch of 8), of three (4) and of all five again (a
// replay), the contexts growing: logits and argmax of every step, in order.
std::vector<std::vector<float>> DecodeScript(const std::string& dir, bool graphs, size_t* num_graphs,
                                             int64_t* replays, bool batch_invariant = true,
                                             DType kv_dtype = DType::kF32) {
  CudaBackend::Options o;
  o.batch_invariant = batch_invariant;
  auto backend = CudaBackend::Create(o).value();
  auto model = LlamaModel::Load(dir, backend.get()).value();
  model->set_use_graphs(graphs);
  auto kv = KvCacheStorage::Create(backend.get(), model->KvGeometry(320, 16, kv_dtype)).value();
  const int64_t vocab = model->config().vocab_size;
  std::vector<int64_t> len(5);
  std::vector<std::vector<int32_t>> tables(5);
  std::vector<std::vector<float>> outputs;
  std::mt19937 rng(9);
  for (int64_t i = 0; i < 5; ++i) {
    for (int b = 0; b < 64; ++b) tables[i].push_back(static_cast<int32_t>(64 * i + b));
    ForwardInput in;
    len[i] = kEmulated ? (i == 4 ? 780 : 16 * (i + 1)) : 300 + 150 * i;
    for (int64_t t = 0; t < len[i]; ++t) in.token_ids.push_back(static_cast<int32_t>(rng() % vocab));
    in.seqs.push_back({len[i], 0, tables[i]});
    std::vector<float> ignored;
    EXPECT_TRUE(model->Forward(in, kv.get(), &ignored).ok());
  }
  for (std::vector<int64_t> who : {std::vector<int64_t>{0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {1, 3, 4}, {0, 1, 2, 3, 4}}) {
    ForwardInput in;
    in.allow_graph = true;
    for (size_t k = 0; k < who.size(); ++k) {
      const int64_t i = who[k];
      in.token_ids.push_back(static_cast<int32_t>(rng() % vocab));
      in.seqs.push_back({1, len[i]++, tables[i]});
      in.logits_rows.push_back(static_cast<int32_t>(k));
      in.argmax_only.push_back(k % 2);
    }
    std::vector<float> logits;
    std::vector<int32_t> argmax;
    const absl::Status s = model->Forward(in, kv.get(), &logits, &argmax);
    EXPECT_TRUE(s.ok()) << s;
    logits.insert(logits.end(), argmax.begin(), argmax.end());  // ids are small: exact as floats
    outputs.push_back(std::move(logits));
  }
  EXPECT_TRUE(model->graph_error().empty()) << model->graph_error();
  *num_graphs = model->num_graphs();
  *replays = model->graph_replays();
  EXPECT_TRUE(backend->CheckErrors().ok());
  return outputs;
}

TEST_P(CudaForwardTest, DecodeGraphsMatchOpByOpBitForBit) {
  const std::string dir = testing_util::TinyModel(GetParam(), 7, DType::kBF16);
  size_t eager_graphs = 0, graphs = 0;
  int64_t eager_replays = 0, replays = 0;
  const auto eager = DecodeScript(dir, false, &eager_graphs, &eager_replays);
  const auto replayed = DecodeScript(dir, true, &graphs, &replays);
  EXPECT_EQ(eager_graphs, 0u);
  EXPECT_EQ(graphs, 2u) << "one graph for a batch of 8, one for 4";
  EXPECT_EQ(replays, 2) << "the second and fourth steps replay the graph of 8";
  ASSERT_EQ(eager.size(), replayed.size());
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_EQ(eager[i], replayed[i]) << "decode step " << i;
}

// The fusions (TANDEM_CUDA_FUSION: bias and silu · up in the GEMV; the q|k|v split, q/k norms, RoPE
// and the cache write in one kernel) change no bit of a forward pass. On the emulator, which counts
// kernels, a step runs per layer: one fewer for RoPE, three more for the split of several tokens, two
// for Qwen3's norms; where the GEMV runs (up to kGemvMaxRows tokens) one for silu · up, one for the
// attention bias and two for the residual adds and norms it takes in, elsewhere four for the GEMM inputs
// that the norms, attention and silu · up write already rounded; and over a cache of the weights' 16-bit
// type, where the GEMV runs, the prologue kernel too (the q|k|v GEMV's last blocks run it).
TEST_P(CudaForwardTest, FusionsChangeNoBitAndRunFewerKernels) {
  const std::string dir = testing_util::TinyModel(GetParam(), 7, DType::kBF16);
  std::vector<int32_t> tokens(44);
  std::mt19937 rng(5);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 256);
  for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
    // Fusions off, on, and on but for the prologue in the q|k|v GEMV (TANDEM_CUDA_GEMV_HEADS=0).
    std::vector<uint64_t> kernels[3];
    std::vector<float> logits[3];
    for (int fusion : {0, 1, 2}) {
      ::setenv("TANDEM_CUDA_FUSION", fusion > 0 ? "1" : "0", 1);
      if (fusion == 2) ::setenv("TANDEM_CUDA_GEMV_HEADS", "0", 1);
      auto backend = CudaBackend::Create({});
      ::unsetenv("TANDEM_CUDA_FUSION");
      ::unsetenv("TANDEM_CUDA_GEMV_HEADS");
      ASSERT_TRUE(backend.ok()) << backend.status();
      logits[fusion] = AllLogits(backend->get(), dir, tokens, &kernels[fusion], kv_dtype);
      EXPECT_TRUE((*backend)->CheckErrors().ok());
    }
    ASSERT_FALSE(logits[0].empty());
    EXPECT_EQ(logits[1], logits[0]) << DTypeName(kv_dtype) << " cache";
    EXPECT_EQ(logits[2], logits[0]) << DTypeName(kv_dtype) << " cache, the prologue kernel";
    if (!kEmulated) continue;
    auto cpu = CpuBackend::Create({}).value();
    const ModelConfig c = LlamaModel::Load(dir, cpu.get()).value()->config();
    const std::vector<int64_t> step_tokens = {16, 16, 8, 1, 1, 1, 1};  // prompt chunks, then decode steps
    ASSERT_EQ(kernels[0].size(), step_tokens.size());
    for (size_t i = 0; i < kernels[0].size(); ++i) {
      const bool gemv = step_tokens[i] <= cuda::kGemvMaxRows;
      const int64_t saved = 1 + (step_tokens[i] > 1 ? 3 : 0) + (c.qk_norm ? 2 : 0) +
                            (gemv ? 3 + (c.attention_bias ? 1 : 0) + (kv_dtype == DType::kBF16 ? 1 : 0) : 4);
      // Every row wants logits: with the GEMV the first and the final norm go into the projections;
      // with cuBLAS the final norm rounds the LM head's input.
      EXPECT_EQ(int64_t(kernels[0][i] - kernels[1][i]), saved * c.num_hidden_layers + (gemv ? 2 : 1))
          << "step " << i << ", " << DTypeName(kv_dtype) << " cache";
      EXPECT_EQ(int64_t(kernels[2][i] - kernels[1][i]), gemv && kv_dtype == DType::kBF16 ? c.num_hidden_layers : 0)
          << "step " << i << ", " << DTypeName(kv_dtype) << " cache: the prologue kernel a layer";
      if (i == 3) {
        std::printf("%s decode step, %lld layers, %s cache: %llu kernels fused, %llu unfused\n", GetParam().c_str(),
                    static_cast<long long>(c.num_hidden_layers), std::string(DTypeName(kv_dtype)).c_str(),
                    static_cast<unsigned long long>(kernels[1][i]), static_cast<unsigned long long>(kernels[0][i]));
      }
    }
  }
}

// The same without --batch-invariant: decode steps of up to 8 rows run the GEMV with its fused norms,
// biases, activations and residual adds, and the q|k|v prologue kernel, captured in graphs and
// replayed: the bits of the same steps op by op (the GEMV's rows do not depend on the padding rows).
// Mistral's steps keep an f32 cache (the prologue kernel in the graphs); the others a BF16 one, as on a
// GPU by default (the q|k|v GEMV's last blocks running the prologue, its counters reset at each replay).
TEST_P(CudaForwardTest, FusedDecodeGraphsMatchOpByOpBitForBit) {
  const std::string dir = testing_util::TinyModel(GetParam(), 7, DType::kBF16);
  const DType kv_dtype = GetParam() == "tiny-mistral" ? DType::kF32 : DType::kBF16;
  size_t eager_graphs = 0, graphs = 0;
  int64_t eager_replays = 0, replays = 0;
  const auto eager = DecodeScript(dir, false, &eager_graphs, &eager_replays, /*batch_invariant=*/false, kv_dtype);
  const auto replayed = DecodeScript(dir, true, &graphs, &replays, /*batch_invariant=*/false, kv_dtype);
  EXPECT_EQ(graphs, 2u);
  EXPECT_EQ(replays, 2);
  ASSERT_EQ(eager.size(), replayed.size());
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_EQ(eager[i], replayed[i]) << "decode step " << i;
}

TEST_P(CudaForwardTest, MatchesCpuInF32) { CompareModels(GetParam(), DType::kF32); }
TEST_P(CudaForwardTest, MatchesCpuInBf16) { CompareModels(GetParam(), DType::kBF16); }
TEST_P(CudaForwardTest, MatchesCpuInF16) { CompareModels(GetParam(), DType::kF16); }
TEST_P(CudaForwardTest, BF16WeightsComputedInF16MatchTheCpuEightTimesCloser) {
  CompareModels(GetParam(), DType::kBF16, DType::kF16);
  // An auto KV cache takes the type the weights are kept in.
  CudaBackend::Options o;
  o.compute_dtype = DType::kF16;
  auto gpu = CudaBackend::Create(o).value();
  auto model = LlamaModel::Load(testing_util::TinyModel(GetParam(), 7, DType::kBF16), gpu.get()).value();
  EXPECT_EQ(model->KvCacheDType(std::nullopt), DType::kF16);
}

TEST_P(CudaForwardTest, SplitGemmInputsOverBF16WeightsMatchTheCpuAsF32Does) {
  CompareModels(GetParam(), DType::kBF16, std::nullopt, /*split_inputs=*/true);
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaForwardTest, testing_util::TinyPresets(), testing_util::PresetName);

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (tandem::cuda::DeviceCount() == 0) {
    std::printf("SKIPPED: no CUDA device visible\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
