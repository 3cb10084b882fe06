// CPU kernels against naive double-precision references, over every weight dtype and both Linear
// paths (direct dot products for small batches, tiled GEMM for large ones).
#include "common/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/bf16_kernels.h"
#include "common/backend/cpu/cpu_kernels.h"
#include "gtest/gtest.h"
#include "tests/unit/linear_each.h"

namespace tandem {
namespace {

struct Matrix {
  std::vector<uint16_t> half;  // storage for 16-bit dtypes
  std::vector<float> f32;      // storage for F32, and the exact values for references
  DeviceWeight weight;
};

Matrix RandomWeight(int64_t rows, int64_t cols, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  Matrix m;
  m.f32.resize(rows * cols);
  if (dtype != DType::kF32) m.half.resize(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float v = dist(rng);
    if (dtype == DType::kBF16) {
      m.half[i] = F32ToBf16(v);
      m.f32[i] = Bf16ToF32(m.half[i]);
    } else if (dtype == DType::kF16) {
      m.half[i] = F32ToF16(v);
      m.f32[i] = F16ToF32(m.half[i]);
    } else {
      m.f32[i] = v;
    }
  }
  m.weight.dtype = dtype;
  m.weight.rows = rows;
  m.weight.cols = cols;
  m.weight.data = dtype == DType::kF32 ? static_cast<const void*>(m.f32.data()) : m.half.data();
  return m;
}

// Batch invariance: for n in 1..19 (tiles of up to 8 rows and their remainders), Linear over the
// first n rows of x gives each output the bits of that row's one-row Linear; check(row, column,
// value) is asked about each output too. False (with the failure added) at the first miss.
template <typename Check>
bool EveryBatchGivesOneRowsBits(CpuBackend& backend, const Matrix& x, const Matrix& w,
                                const std::string& what, const Check& check) {
  const int64_t rows = w.weight.rows, cols = w.weight.cols;
  std::vector<float> one(rows);
  for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 19}) {
    std::vector<float> out(n * rows);
    backend.Linear(x.f32.data(), n, w.weight, nullptr, out.data());
    for (int64_t i = 0; i < n; ++i) {
      backend.Linear(x.f32.data() + i * cols, 1, w.weight, nullptr, one.data());
      for (int64_t j = 0; j < rows; ++j) {
        if (std::bit_cast<uint32_t>(out[i * rows + j]) != std::bit_cast<uint32_t>(one[j])) {
          ADD_FAILURE() << what << " n=" << n << " row " << i << " col " << j << ": "
                        << out[i * rows + j] << " in the batch, " << one[j] << " alone";
          return false;
        }
        if (!check(i, j, out[i * rows + j])) return false;
      }
    }
  }
  return true;
}

class LinearTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(LinearTest, MatchesDoubleReference) {
  const auto [dtype, n] = GetParam();
  const int64_t rows = 67, cols = 203;  // odd sizes exercise the vector tails
  auto backend = CpuBackend::Create({}).value();
  Matrix w = RandomWeight(rows, cols, dtype, 1);
  Matrix x = RandomWeight(n, cols, DType::kF32, 2);
  std::vector<float> bias_v(rows);
  for (int64_t j = 0; j < rows; ++j) bias_v[j] = 0.1f * j;
  DeviceWeight bias{DType::kF32, 1, rows, bias_v.data(), nullptr};
  std::vector<float> out(n * rows);
  backend->Linear(x.f32.data(), n, w.weight, &bias, out.data());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < rows; ++j) {
      double ref = bias_v[j];
      for (int64_t k = 0; k < cols; ++k) ref += double(x.f32[i * cols + k]) * w.f32[j * cols + k];
      // f32 accumulation of 203 products of N(0,1) values: error well under 1e-4 relative to
      // sqrt(203).
      ASSERT_NEAR(out[i * rows + j], ref, 2e-4 * std::sqrt(cols)) << "row " << i << " col " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypesAndBatches, LinearTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kF16,
                                                              DType::kBF16),
                                            ::testing::Values(1, 3, 8, 9, 40)),
                         [](const auto& info) {
                           return std::string(DTypeName(std::get<0>(info.param))) + "_n" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Batch invariance: every batch size's Linear (up to 8 rows streamed as batch 1 is, past that
// register-blocked tiles of weight rows × up to 8 activation rows, and the rest) gives each row
// exactly the bits of a one-row Linear (whose rows are streamed in runs the threads claim: 53 rows
// are a run a thread of 27 and 26 rows, each four streams and a remainder; 1,031 rows 516 and 515;
// 8,195 f32 rows of 131, 4.3 MB, runs of 4,098, 2,049, 2,001 (1 MiB) and 47 rows).
TEST(CpuBackendTest, LinearRowsAreTheSameBitsAtEveryBatchSize) {
  auto backend = CpuBackend::Create({}).value();
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{53, 203}, {1031, 67}, {8195, 131}}) {
      // tiles with a remainder, vector tails
      Matrix w = RandomWeight(rows, cols, dtype, 3);
      Matrix x = RandomWeight(19, cols, DType::kF32, 4);
      ASSERT_TRUE(EveryBatchGivesOneRowsBits(
          *backend, x, w, absl::StrCat(std::string(DTypeName(dtype)), " ", rows, "x", cols),
          [](int64_t, int64_t, float) { return true; }));
    }
  }
}

// One input's projections (q, k, v; gate, up) read as one job at batch 1 (LinearEach): each
// output is its own Linear's bits, where the whole is one run a thread (7 + 53 + 40 rows) and where
// it is many chunks, some running from one weight into the next (1,031 + 8,195 + 517 rows), with a
// bias on one; the same at three rows (streamed together as well), for weights of different dtypes
// (a Linear each) and with BF16 activations (streamed together too, with AVX-512 BF16).
TEST(CpuBackendTest, ProjectionsReadAsOneGiveEachLinearsBits) {
  using test_support::LinearEachGivesEachLinearsBits;
  const int64_t cols = 131;
  const Matrix x = RandomWeight(3, cols, DType::kF32, 30);
  for (ActivationDType act : {ActivationDType::kF32, ActivationDType::kBF16}) {
    CpuBackend::Options options;
    options.activations = act;
    auto backend = CpuBackend::Create(options).value();
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (const std::vector<int64_t>& rows :
           {std::vector<int64_t>{7, 53, 40}, std::vector<int64_t>{1031, 8195, 517}}) {
        std::vector<Matrix> ws;
        std::vector<std::vector<float>> outs;
        for (size_t i = 0; i < rows.size(); ++i) {
          // The last one's dtype differs in the mixed case below.
          ws.push_back(RandomWeight(rows[i], cols, dtype, 20 + static_cast<uint32_t>(i)));
          outs.emplace_back(3 * rows[i]);
        }
        std::vector<float> bias_v(rows[1]);
        for (int64_t j = 0; j < rows[1]; ++j) bias_v[j] = 0.01f * j;
        const DeviceWeight bias{DType::kF32, 1, rows[1], bias_v.data(), nullptr};
        const Backend::Projection ps[] = {{&ws[0].weight, nullptr, outs[0].data()},
                                          {&ws[1].weight, &bias, outs[1].data()},
                                          {&ws[2].weight, nullptr, outs[2].data()}};
        const std::string what =
            absl::StrCat(std::string(DTypeName(dtype)), " rows ", rows[0], "+", rows[1], "+",
                         rows[2], act == ActivationDType::kBF16 ? ", bf16 activations" : "");
        for (int64_t n : {1, 3}) {
          ASSERT_TRUE(LinearEachGivesEachLinearsBits(*backend, x.f32.data(), n, ps, what));
        }
        const Matrix other =
            RandomWeight(rows[2], cols, dtype == DType::kF32 ? DType::kBF16 : DType::kF32, 29);
        const Backend::Projection mixed[] = {
            ps[0], ps[1], {&other.weight, nullptr, outs[2].data()}};
        ASSERT_TRUE(
            LinearEachGivesEachLinearsBits(*backend, x.f32.data(), 1, mixed, what + ", mixed"));
      }
    }
  }
}

// --activation-dtype bf16: BF16 weights' Linear rounds x to BF16 (nearest even) and sums exact
// products in f32 (vdpbf16ps; the f32 kernels on the rounded x without AVX-512 BF16). Against a
// double reference over the rounded x, at every batch size, with the same bits as a one-row Linear;
// odd shapes (k = 203 and 45: not multiples of the 32-column blocks). Other weights keep f32.
TEST(CpuBackendTest, Bf16ActivationsMatchTheRoundedReferenceAtEveryBatchSize) {
  CpuBackend::Options options;
  options.activations = ActivationDType::kBF16;
  auto backend = CpuBackend::Create(options).value();
  auto exact = CpuBackend::Create({}).value();
  // 53 and 1,031 weight rows: up to 8 activation rows stream (four runs and a remainder; 1,031
  // rows in runs the threads claim), past that the tiles.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{53, 203}, {53, 45}, {1031, 203}}) {
    Matrix w = RandomWeight(rows, cols, DType::kBF16, 5);
    Matrix x = RandomWeight(19, cols, DType::kF32, 6);
    ASSERT_TRUE(EveryBatchGivesOneRowsBits(
        *backend, x, w, absl::StrCat(rows, "x", cols), [&](int64_t i, int64_t j, float value) {
          double ref = 0;
          for (int64_t k = 0; k < cols; ++k) {
            ref += double{Bf16ToF32(F32ToBf16(x.f32[i * cols + k]))} * w.f32[j * cols + k];
          }
          EXPECT_NEAR(value, ref, 2e-4 * std::sqrt(cols)) << "row " << i << " col " << j;
          return std::abs(value - ref) <= 2e-4 * std::sqrt(cols);
        }));
    // The rounding is real: some output moves by more than the f32 path's error.
    std::vector<float> rounded(rows), f32(rows);
    backend->Linear(x.f32.data(), 1, w.weight, nullptr, rounded.data());
    exact->Linear(x.f32.data(), 1, w.weight, nullptr, f32.data());
    double moved = 0;
    for (int64_t j = 0; j < rows; ++j)
      moved = std::max(moved, double{std::abs(rounded[j] - f32[j])});
    EXPECT_GT(moved, 1e-3);
  }
  // F16 weights keep f32 activations: the same bits as the exact backend's.
  Matrix w = RandomWeight(21, 203, DType::kF16, 7);
  Matrix x = RandomWeight(3, 203, DType::kF32, 8);
  std::vector<float> a(3 * 21), b(3 * 21);
  backend->Linear(x.f32.data(), 3, w.weight, nullptr, a.data());
  exact->Linear(x.f32.data(), 3, w.weight, nullptr, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// The activations' rounding (vectorised with AVX-512 BF16) gives F32ToBf16's bits for every kind
// of value: ties to even either way, the largest finite values rounding to infinity, subnormals,
// zeros, infinities and NaNs (quiet, signalling, either sign), on rows with a scalar tail (k = 37),
// zero padded to the 32-column blocks.
TEST(CpuBackendTest, RoundingToBf16GivesTheScalarBitsOnEveryValue) {
  std::vector<float> x = {std::bit_cast<float>(uint32_t{0x3f808000}),
                          std::bit_cast<float>(uint32_t{0x3f818000}),
                          std::bit_cast<float>(uint32_t{0x3f808001}),
                          std::bit_cast<float>(uint32_t{0x7f7fffff}),
                          std::bit_cast<float>(uint32_t{0xff7fffff}),
                          std::bit_cast<float>(uint32_t{0x00000001}),
                          std::bit_cast<float>(uint32_t{0x807fffff}),
                          0.f,
                          -0.f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::bit_cast<float>(uint32_t{0x7fc00000}),
                          std::bit_cast<float>(uint32_t{0xffc00001}),
                          std::bit_cast<float>(uint32_t{0x7f800001}),
                          std::bit_cast<float>(uint32_t{0xff80ffff})};
  std::mt19937 rng(41);
  std::uniform_int_distribution<uint32_t> bits;
  while (x.size() < 3 * 37) x.push_back(std::bit_cast<float>(bits(rng)));
  const int64_t k = 37, kp = cpu::Bf16PaddedCols(k);
  ASSERT_EQ(kp, 64);
  std::vector<uint16_t> out(3 * kp, 0xffff);
  cpu::RoundRowsToBf16(x.data(), 3, k, out.data());
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t i = 0; i < kp; ++i) {
      const uint16_t want = i < k ? F32ToBf16(x[t * k + i]) : 0;
      ASSERT_EQ(out[t * kp + i], want) << "row " << t << " column " << i;
    }
  }
}

// The weight kernels' prefetch distance: by CPU vendor (Intel 2 KiB with batch 1's f32 rows
// prefetched too, others 8 KiB without), or as the environment says. ctest runs this binary once
// more with TANDEM_CPU_PREFETCH_BYTES=512 and TANDEM_CPU_PREFETCH_BATCH1=1, where every kernel test
// above must give the same bits, and this test with TANDEM_CPU_PREFETCH_BYTES=lots, which the
// backend refuses by name.
TEST(CpuBackendTest, PrefetchPlanIsTheVendorsOrTheEnvironments) {
  const bool intel = cpu::IsIntelCpu();
  const cpu::PrefetchPlan& plan = cpu::Prefetch();
  const char* bytes = std::getenv("TANDEM_CPU_PREFETCH_BYTES");
  const char* batch1 = std::getenv("TANDEM_CPU_PREFETCH_BATCH1");
  const bool bad = bytes != nullptr && std::string(bytes) == "lots";
  ASSERT_EQ(plan.error.empty(), !bad) << plan.error;
  if (bad) {
    const auto backend = CpuBackend::Create({});
    ASSERT_FALSE(backend.ok());
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(backend.status().message().find("TANDEM_CPU_PREFETCH_BYTES=lots"), std::string::npos)
        << backend.status();
    EXPECT_EQ(plan.bytes, intel ? 2048 : 8192);  // the default kept
    return;
  }
  EXPECT_EQ(plan.overridden, bytes != nullptr || batch1 != nullptr);
  EXPECT_EQ(plan.bytes, bytes != nullptr ? std::atoll(bytes) : intel ? 2048 : 8192) << intel;
  EXPECT_EQ(plan.batch1, batch1 != nullptr ? std::string(batch1) == "1" : intel) << intel;
}

TEST(CpuBackendTest, ArgmaxRowsTakesTheLowestIdOfTheMaximumAndNeverNaN) {
  auto b = CpuBackend::Create({}).value();
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> rows = {
      {0.f, 3.f, 1.f, 3.f, 2.f, -1.f, 0.5f, 3.f, 0.f, 0.f, 1.f},  // ties: the first 3
      {nan, 1.f, nan, 2.f, nan, 2.f, 0.f, 0.f, 0.f, 0.f, 0.f},    // NaN never wins
      {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
      {nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan},
      {1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, inf},  // the tail past the 8-wide lanes
  };
  std::vector<float> x;
  for (const auto& r : rows) x.insert(x.end(), r.begin(), r.end());
  std::vector<int32_t> out(rows.size(), -1);
  b->ArgmaxRows(x.data(), static_cast<int64_t>(rows.size()), 11, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 3, 0, 0, 10}));
}

// SiLU · up in vector lanes (cpu::SiluMul): within a few ulp of the double formula over the whole
// range a gate takes (both signs, past exp's overflow), and an element's bits do not depend on
// where a call's range starts or ends (the ops split elements over threads by the batch's size).
TEST(CpuBackendTest, SiluMulIsCloseToTheFormulaAndTheSameBitsWhereverItsRangeSplits) {
  const int64_t n = 1237;
  std::vector<float> gate(n), up(n), whole(n), split(n);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> wide(-120.f, 120.f), narrow(-6.f, 6.f);
  for (int64_t i = 0; i < n; ++i) {
    gate[i] = i % 3 == 0 ? wide(rng) : narrow(rng);
    up[i] = narrow(rng);
  }
  gate[5] = 0.f;
  gate[6] = -0.f;
  gate[7] = 88.5f;  // exp(88.5) overflows f32
  gate[8] = -88.5f;
  cpu::SiluMul(gate.data(), up.data(), n, whole.data());
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i], want = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(whole[i], want, 1e-6 * std::abs(want) + 1e-30) << "gate " << gate[i];
  }
  for (const int64_t cut : {int64_t{1}, int64_t{7}, int64_t{13}, int64_t{600}, n - 3}) {
    cpu::SiluMul(gate.data(), up.data(), cut, split.data());
    cpu::SiluMul(gate.data() + cut, up.data() + cut, n - cut, split.data() + cut);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(whole[i], split[i]) << "cut " << cut << " at " << i;
  }
}

TEST(CpuBackendTest, PackedGateUpAndColumnCopiesMatchTheSeparateOps) {
  auto b = CpuBackend::Create({}).value();
  const int64_t n = 3, d = 5;
  std::vector<float> packed(n * 2 * d), gate(n * d), up(n * d);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < d; ++j) {
      gate[t * d + j] = packed[t * 2 * d + j] = 0.3f * static_cast<float>(t * d + j) - 2.f;
      up[t * d + j] = packed[t * 2 * d + d + j] = 1.f - 0.2f * static_cast<float>(j);
    }
  }
  std::vector<float> a(n * d), c(n * d);
  b->SiluMul(gate.data(), up.data(), n, d, a.data());
  b->SiluMulPacked(packed.data(), n, d, c.data());
  EXPECT_EQ(a, c);
  std::vector<float> cols(n * 3);
  b->CopyColumns(packed.data(), n, 2 * d, 4, 3, cols.data());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(cols[t * 3 + j], packed[t * 2 * d + 4 + j]);
  }
}

TEST(CpuBackendTest, RmsNormMatchesReference) {
  auto backend = CpuBackend::Create({}).value();
  std::vector<float> x = {1, -2, 3, 4, 0.5f, 0.25f, -8, 2};
  std::vector<float> wv = {1, 2, 0.5f, -1};
  DeviceWeight w{DType::kF32, 1, 4, wv.data(), nullptr};
  std::vector<float> out(8);
  backend->RmsNorm(x.data(), w, 1e-5f, 2, 4, out.data());
  for (int r = 0; r < 2; ++r) {
    double ss = 0;
    for (int j = 0; j < 4; ++j) ss += x[r * 4 + j] * x[r * 4 + j];
    const double inv = 1 / std::sqrt(ss / 4 + 1e-5);
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(out[r * 4 + j], x[r * 4 + j] * inv * wv[j], 1e-6);
  }
}

TEST(CpuBackendTest, RopeRotatesHalvesByPosition) {
  auto backend = CpuBackend::Create({}).value();
  // One token at position 3, one head of dim 4 for q and k; inv_freq = {1, 0.5}.
  std::vector<float> q = {1, 2, 3, 4}, k = {1, 0, 0, 1};
  std::vector<float> inv = {1.0f, 0.5f};
  const int32_t pos = 3;
  backend->Rope(q.data(), k.data(), &pos, inv.data(), 1, 1, 1, 4);
  const double a0 = 3.0, a1 = 1.5;
  EXPECT_NEAR(q[0], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-6);
  EXPECT_NEAR(q[2], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-6);
  EXPECT_NEAR(q[1], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-6);
  EXPECT_NEAR(q[3], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-6);
  EXPECT_NEAR(k[0], std::cos(a0), 1e-6);
  EXPECT_NEAR(k[3], std::cos(a1), 1e-6);
}

class CpuPagedAttentionTest : public ::testing::TestWithParam<DType> {};

// In every cache dtype: the cache holds k and v rounded to it (int8: codes and a scale per token
// and head, within the slot's block), and the output is dense causal attention over those rounded
// keys and values.
TEST_P(CpuPagedAttentionTest, MatchesDenseCausalAttention) {
  auto backend = CpuBackend::Create({}).value();
  const DType dtype = GetParam();
  const int64_t heads = 4, kv_heads = 2, hd = 8, n = 5, bs = 2;
  KvCacheGeometry g{1, 4, bs, kv_heads, hd};
  g.dtype = dtype;
  std::vector<char> kc(g.bytes_per_layer()), vc(g.bytes_per_layer());
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  std::vector<float> q(n * heads * hd), k(n * kv_heads * hd), v(n * kv_heads * hd),
      out(n * heads * hd);
  for (auto* vec : {&q, &k, &v})
    for (auto& e : *vec) e = dist(rng);
  // k or v as the cache holds it: rounded to its type; int8 per token and head, codes of
  // max|x| / 127.
  const auto rounded = [&](const std::vector<float>& x) {
    std::vector<float> r(x.size());
    for (int64_t row = 0; row < n * kv_heads; ++row) {
      const float* xs = x.data() + row * hd;
      float amax = 0;
      for (int64_t i = 0; i < hd; ++i) amax = std::max(amax, std::abs(xs[i]));
      for (int64_t i = 0; i < hd; ++i) {
        r[row * hd + i] = dtype == DType::kBF16  ? Bf16ToF32(F32ToBf16(xs[i]))
                          : dtype == DType::kF16 ? F16ToF32(F32ToF16(xs[i]))
                          : dtype == DType::kI8
                              ? std::nearbyint(xs[i] / (amax / 127)) * (amax / 127)
                              : xs[i];
      }
    }
    return r;
  };
  std::vector<int32_t> table = {3, 1, 0};
  std::vector<int32_t> seq_indptr = {0, 5}, positions = {0, 1, 2, 3, 4}, ctx = {5}, bptr = {0, 3},
                       slots;
  for (int32_t p : positions) slots.push_back(table[p / bs] * bs + p % bs);
  AttentionMetadata md{
      1,           n, 5, seq_indptr.data(), positions.data(), ctx.data(), bptr.data(), table.data(),
      slots.data()};
  const float scale = 1 / std::sqrt(float(hd));
  backend->PagedAttention(q.data(), k.data(), v.data(), kc.data(), vc.data(), g, 0, md, heads,
                          scale, out.data());
  // Token p's keys and values sit at its slot, rounded to the cache's type.
  const std::vector<float> k_held = rounded(k), v_held = rounded(v);
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      for (const auto& [cache, held] : {std::pair{&kc, &k_held}, std::pair{&vc, &v_held}}) {
        std::vector<float> stored(hd);
        ConvertToF32(dtype,
                     cache->data() + g.slot_offset(slots[p]) + h * hd * g.bytes_per_element(),
                     stored.data(), stored.size());
        const float s =
            dtype == DType::kI8
                ? reinterpret_cast<const float*>(cache->data() + g.scale_offset(slots[p]))[h]
                : 1.f;
        for (int64_t i = 0; i < hd; ++i)
          ASSERT_EQ(stored[i] * s, (*held)[(p * kv_heads + h) * hd + i]) << p << " " << h;
      }
    }
  }
  k = k_held;
  v = v_held;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kh = h / (heads / kv_heads);
      std::vector<double> w(t + 1);
      double mx = -1e30, sum = 0;
      for (int64_t p = 0; p <= t; ++p) {
        double s = 0;
        for (int64_t i = 0; i < hd; ++i)
          s += q[(t * heads + h) * hd + i] * k[(p * kv_heads + kh) * hd + i];
        w[p] = s * scale;
        mx = std::max(mx, w[p]);
      }
      for (auto& e : w) sum += e = std::exp(e - mx);
      for (int64_t i = 0; i < hd; ++i) {
        double ref = 0;
        for (int64_t p = 0; p <= t; ++p) ref += w[p] / sum * v[(p * kv_heads + kh) * hd + i];
        EXPECT_NEAR(out[(t * heads + h) * hd + i], ref, 1e-5);
      }
    }
  }
}

// Odd shapes (head_dim 36: not a multiple of any vector width; blocks of 5; three query heads per
// KV head; prompts longer than a query tile), two sequences: each token's output is the same bits
// whether the prompt runs in one step, in chunks, token by token, or batched with the other
// sequence (the engine's batch invariance), and near dense attention over the cache's values.
TEST_P(CpuPagedAttentionTest, ChunkedAndBatchedGiveTheSameBits) {
  auto backend = CpuBackend::Create({}).value();
  const DType dtype = GetParam();
  const int64_t heads = 6, kv_heads = 2, hd = 36, bs = 5, lens[2] = {37, 23};
  KvCacheGeometry g{1, 20, bs, kv_heads, hd};
  g.dtype = dtype;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  // Per sequence: q, k, v of every token, and its block table (sequence 1 takes blocks 19, 18, ...;
  // sequence 0 takes 0, 2, 4, ...).
  std::vector<float> q[2], k[2], v[2];
  std::vector<int32_t> table[2];
  for (int s = 0; s < 2; ++s) {
    q[s].resize(lens[s] * heads * hd);
    k[s].resize(lens[s] * kv_heads * hd);
    v[s].resize(lens[s] * kv_heads * hd);
    for (auto* vec : {&q[s], &k[s], &v[s]})
      for (auto& e : *vec) e = dist(rng);
    for (int64_t b = 0; b < (lens[s] + bs - 1) / bs; ++b)
      table[s].push_back(s == 0 ? static_cast<int32_t>(2 * b) : static_cast<int32_t>(19 - b));
  }
  // Runs steps of (sequence, first token, count) pieces over fresh caches; returns each sequence's
  // outputs.
  struct Piece {
    int seq;
    int64_t start, count;
  };
  const auto run = [&](const std::vector<std::vector<Piece>>& steps) {
    std::vector<char> kc(g.bytes_per_layer()), vc(g.bytes_per_layer());
    std::vector<float> outs[2] = {std::vector<float>(lens[0] * heads * hd),
                                  std::vector<float>(lens[1] * heads * hd)};
    for (const auto& step : steps) {
      std::vector<int32_t> seq_indptr = {0}, positions, ctx, bptr = {0}, blocks, slots;
      std::vector<float> sq, sk, sv, out;
      for (const Piece& p : step) {
        for (int64_t t = p.start; t < p.start + p.count; ++t) {
          positions.push_back(static_cast<int32_t>(t));
          slots.push_back(table[p.seq][t / bs] * bs + t % bs);
        }
        seq_indptr.push_back(static_cast<int32_t>(positions.size()));
        ctx.push_back(static_cast<int32_t>(p.start + p.count));
        blocks.insert(blocks.end(), table[p.seq].begin(), table[p.seq].end());
        bptr.push_back(static_cast<int32_t>(blocks.size()));
        const auto append = [&](std::vector<float>& dst, const std::vector<float>& src,
                                int64_t width) {
          dst.insert(dst.end(), src.begin() + p.start * width,
                     src.begin() + (p.start + p.count) * width);
        };
        append(sq, q[p.seq], heads * hd);
        append(sk, k[p.seq], kv_heads * hd);
        append(sv, v[p.seq], kv_heads * hd);
      }
      out.resize(sq.size());
      AttentionMetadata md{static_cast<int64_t>(step.size()),
                           static_cast<int64_t>(positions.size()),
                           *std::max_element(ctx.begin(), ctx.end()),
                           seq_indptr.data(),
                           positions.data(),
                           ctx.data(),
                           bptr.data(),
                           blocks.data(),
                           slots.data()};
      backend->PagedAttention(sq.data(), sk.data(), sv.data(), kc.data(), vc.data(), g, 0, md,
                              heads, 0.3f, out.data());
      int64_t row = 0;
      for (const Piece& p : step) {
        std::copy_n(out.begin() + row * heads * hd, p.count * heads * hd,
                    outs[p.seq].begin() + p.start * heads * hd);
        row += p.count;
      }
    }
    return std::vector<std::vector<float>>{outs[0], outs[1]};
  };
  const auto whole = run({{{0, 0, lens[0]}}, {{1, 0, lens[1]}}});
  std::vector<std::vector<Piece>> tokenwise;
  for (int64_t t = 0; t < lens[0]; ++t) tokenwise.push_back({{0, t, 1}});
  for (int64_t t = 0; t < lens[1]; ++t) tokenwise.push_back({{1, t, 1}});
  const auto chunked = run({{{0, 0, 7}, {1, 0, 20}}, {{1, 20, 3}, {0, 7, 1}}, {{0, 8, 29}}});
  const auto one_by_one = run(tokenwise);
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(whole[s].size(), chunked[s].size());
    EXPECT_EQ(std::memcmp(whole[s].data(), chunked[s].data(), whole[s].size() * sizeof(float)), 0)
        << "sequence " << s << " chunked";
    EXPECT_EQ(std::memcmp(whole[s].data(), one_by_one[s].data(), whole[s].size() * sizeof(float)),
              0)
        << "sequence " << s << " token by token";
  }
  // Near dense attention over the exact inputs (the cache's rounding bounds the distance).
  const double tol = dtype == DType::kF32 ? 1e-5 : dtype == DType::kI8 ? 6e-2 : 3e-2;
  for (int s = 0; s < 2; ++s) {
    for (int64_t t = 0; t < lens[s]; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kh = h / (heads / kv_heads);
        std::vector<double> w(t + 1);
        double mx = -1e30, sum = 0;
        for (int64_t p = 0; p <= t; ++p) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i)
            dot += double{q[s][(t * heads + h) * hd + i]} * k[s][(p * kv_heads + kh) * hd + i];
          mx = std::max(mx, w[p] = dot * 0.3);
        }
        for (auto& e : w) sum += e = std::exp(e - mx);
        for (int64_t i = 0; i < hd; ++i) {
          double ref = 0;
          for (int64_t p = 0; p <= t; ++p) ref += w[p] / sum * v[s][(p * kv_heads + kh) * hd + i];
          ASSERT_NEAR(whole[s][(t * heads + h) * hd + i], ref, tol)
              << "seq " << s << " token " << t << " head " << h << " dim " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CacheTypes, CpuPagedAttentionTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kI8),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(DTypeName(i.param));
                         });

}  // namespace
}  // namespace tandem
