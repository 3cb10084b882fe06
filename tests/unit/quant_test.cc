// Weight-only quantization below the model: Tandem's layout (codes, int4 nibble order, validation),
// round-to-nearest quantization, and the CPU's fused-dequantization Linear against a plain f32
// dot product over the dequantized weights, on every activation-row count, with ragged groups,
// zero points and act-order permutations; batch invariance; the portable path.
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"

#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cpu/quant_a8_kernels.h"
#include "common/backend/cpu/quant_kernels.h"
#include "common/quant/quantized_matrix.h"
#include "common/quant/rtn.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/linear_each.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

TEST(QuantizedMatrixTest, Int4NibbleOrderIsTheDocumentedOne) {
  QuantizedMatrix m = MakeQuantizedMatrix(QuantType::kInt4, 2, 64, 64);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < 64; ++c) m.SetCode(r, c, static_cast<int>((c * 7 + r) % 16));
  }
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < 64; ++c) {
      EXPECT_EQ(m.Code(r, c), (c * 7 + r) % 16);
      // Block b, byte j: column 32b + j low, 32b + 16 + j high.
      const int64_t b = c / 32, j = c % 32;
      const uint8_t byte = m.codes[r * 32 + b * 16 + j % 16];
      EXPECT_EQ(j < 16 ? byte & 0xF : byte >> 4, (c * 7 + r) % 16) << r << "," << c;
    }
  }
}

TEST(QuantizedMatrixTest, Int8CodesAreSigned) {
  QuantizedMatrix m = MakeQuantizedMatrix(QuantType::kInt8, 1, 3, 3);
  m.SetCode(0, 0, -128);
  m.SetCode(0, 1, 127);
  m.SetCode(0, 2, -1);
  m.scales[0] = 0.5f;
  m.zeros = {-2.f};
  EXPECT_EQ(m.Code(0, 0), -128);
  EXPECT_EQ(m.Code(0, 1), 127);
  EXPECT_FLOAT_EQ(m.Value(0, 0), (-128 + 2) * 0.5f);
  EXPECT_FLOAT_EQ(m.Value(0, 2), (-1 + 2) * 0.5f);
}

TEST(QuantizedMatrixTest, DequantizeUndoesThePermutation) {
  QuantizedMatrix m = MakeQuantizedMatrix(QuantType::kInt8, 1, 4, 2);
  m.perm = {2, 0, 3, 1};
  m.scales = {1.f, 10.f};
  for (int c = 0; c < 4; ++c) m.SetCode(0, c, c + 1);
  // Stored column c holds input column perm[c]; groups follow the stored order.
  EXPECT_EQ(Dequantize(m), (std::vector<float>{2.f, 40.f, 1.f, 30.f}));
}

TEST(QuantizedMatrixTest, ValidateRefusesBrokenLayouts) {
  const QuantizedMatrix good = MakeQuantizedMatrix(QuantType::kInt4, 4, 64, 32);
  EXPECT_TRUE(Validate(good, "w").ok());
  auto expect_bad = [](QuantizedMatrix m, const std::string& why) {
    const absl::Status s = Validate(m, "model.layers.0.mlp.up_proj");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_THAT(s.message(), HasSubstr("model.layers.0.mlp.up_proj")) << why;
    EXPECT_THAT(s.message(), HasSubstr(why));
  };
  QuantizedMatrix m = good;
  m.codes.pop_back();
  expect_bad(m, "codes holds");
  m = good;
  m.scales.push_back(1.f);
  expect_bad(m, "scales holds");
  m = good;
  m.zeros.assign(3, 0.f);
  expect_bad(m, "zeros holds");
  m = good;
  m.scales[5] = NAN;
  expect_bad(m, "not finite");
  m = good;
  m.perm.assign(64, 0);
  expect_bad(m, "not a permutation");
  m = good;
  m.perm.assign(64, 0);
  for (int i = 0; i < 64; ++i) m.perm[i] = i;
  m.perm[10] = 64;
  expect_bad(m, "not a permutation");
  expect_bad(MakeQuantizedMatrix(QuantType::kInt4, 2, 48, 48), "multiple of 32 input columns");
  expect_bad(MakeQuantizedMatrix(QuantType::kInt4, 2, 64, 16), "multiple of 32 columns");
  m = good;
  m.group_size = 0;
  expect_bad(m, "group size");
}

TEST(QuantTypeTest, ParsesTheFlagValues) {
  EXPECT_EQ(ParseQuantType("INT8"), QuantType::kInt8);
  EXPECT_EQ(ParseQuantType("int4"), QuantType::kInt4);
  EXPECT_EQ(ParseQuantType("none"), QuantType::kNone);
  EXPECT_EQ(ParseQuantType("fp8"), std::nullopt);
  EXPECT_EQ(ParseQuantType(""), std::nullopt);
}

TEST(RtnTest, Int8PerChannelSymmetric) {
  const int64_t rows = 5, cols = 70;
  std::vector<float> w = Random(rows * cols, 1);
  w[3] = 0;  // exact zeros stay zero
  const QuantizedMatrix m = QuantizeRtn(w.data(), rows, cols, DefaultRtnOptions(QuantType::kInt8));
  ASSERT_TRUE(Validate(m, "w").ok());
  EXPECT_EQ(m.group_size, cols);
  EXPECT_TRUE(m.zeros.empty());
  const std::vector<float> d = Dequantize(m);
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
    EXPECT_FLOAT_EQ(m.scales[r], amax / 127.f);
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_GE(m.Code(r, c), -127);
      EXPECT_LE(std::fabs(d[r * cols + c] - w[r * cols + c]), m.scales[r] * 0.5001f);
    }
  }
  EXPECT_EQ(d[3], 0.f);
}

TEST(RtnTest, Int4GroupsAsymmetricWithARaggedLastGroup) {
  const int64_t rows = 3, cols = 320;  // groups of 128: 128, 128, 64
  const std::vector<float> w = Random(rows * cols, 2);
  const QuantizedMatrix m = QuantizeRtn(w.data(), rows, cols, DefaultRtnOptions(QuantType::kInt4));
  ASSERT_TRUE(Validate(m, "w").ok());
  EXPECT_EQ(m.num_groups(), 3);
  const std::vector<float> d = Dequantize(m);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < 3; ++g) {
      const float s = m.scales[r * 3 + g], z = m.zeros[r * 3 + g];
      EXPECT_EQ(z, std::nearbyint(z));
      EXPECT_GE(z, 0);
      EXPECT_LE(z, 15);
      for (int64_t c = g * 128; c < std::min<int64_t>(cols, (g + 1) * 128); ++c) {
        EXPECT_LE(std::fabs(d[r * cols + c] - w[r * cols + c]), s * 0.5001f) << r << "," << c;
      }
    }
  }
}

TEST(RtnTest, AllZeroRowsStayZero) {
  const std::vector<float> w(2 * 64, 0.f);
  for (QuantType t : {QuantType::kInt8, QuantType::kInt4}) {
    const QuantizedMatrix m = QuantizeRtn(w.data(), 2, 64, DefaultRtnOptions(t));
    ASSERT_TRUE(Validate(m, "w").ok());
    for (float v : Dequantize(m)) EXPECT_EQ(v, 0.f);
  }
}

TEST(RtnTest, SymmetricInt4UsesZeroPointEight) {
  const std::vector<float> w = Random(2 * 64, 3);
  RtnOptions o = DefaultRtnOptions(QuantType::kInt4);
  o.symmetric = true;
  o.group_size = 32;
  const QuantizedMatrix m = QuantizeRtn(w.data(), 2, 64, o);
  for (float z : m.zeros) EXPECT_EQ(z, 8.f);
}

// Everything a quantized Linear can meet: both types, group sizes that do and do not divide the
// row, zero points or none, act-order permutations.
struct Case {
  QuantType type;
  int64_t rows, cols, group;
  bool symmetric;
  bool permuted;
};

class QuantLinearTest : public ::testing::TestWithParam<Case> {
 protected:
  // The case's matrix (rows: the case's when 0).
  std::shared_ptr<QuantizedMatrix> Make(int64_t rows = 0, uint32_t seed = 11) {
    const Case& c = GetParam();
    if (rows == 0) rows = c.rows;
    RtnOptions o;
    o.type = c.type;
    o.group_size = c.group;
    o.symmetric = c.symmetric;
    const std::vector<float> w = Random(rows * c.cols, seed, 0.05f);
    auto m = std::make_shared<QuantizedMatrix>(QuantizeRtn(w.data(), rows, c.cols, o));
    if (c.permuted) {
      m->perm.resize(c.cols);
      for (int64_t i = 0; i < c.cols; ++i) m->perm[i] = static_cast<int32_t>(i);
      std::shuffle(m->perm.begin(), m->perm.end(), std::mt19937(5));
    }
    return m;
  }
  // out[n][rows] = x · Dequantize(m)^T in double: the reference.
  static std::vector<double> Reference(const QuantizedMatrix& m, const std::vector<float>& x,
                                       int64_t n) {
    const std::vector<float> d = Dequantize(m);
    std::vector<double> out(static_cast<size_t>(n * m.rows));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < m.rows; ++r) {
        double s = 0;
        for (int64_t c = 0; c < m.cols; ++c) s += double{x[i * m.cols + c]} * d[r * m.cols + c];
        out[i * m.rows + r] = s;
      }
    }
    return out;
  }
  static void ExpectClose(const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<float>& x, int64_t cols, const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    // f32 accumulation over `cols` terms: relative to the size of the terms, ~1e-6.
    double scale = 0;
    for (float v : x) scale = std::max(scale, std::fabs(double{v}));
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i],
                  2e-6 * scale * std::sqrt(double(cols)) + 1e-6 * std::fabs(want[i]))
          << what << " element " << i;
    }
  }
};

TEST_P(QuantLinearTest, MatchesTheDequantizedWeightsForEveryRowCount) {
  const Case& c = GetParam();
  auto backend = CpuBackend::Create({}).value();
  auto m = Make();
  const DeviceWeight w = backend->UploadQuantizedWeight(m).value();
  EXPECT_EQ(w.bytes(), m->bytes());
  for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17}) {
    const std::vector<float> x = Random(n * c.cols, 100 + n);
    std::vector<float> out(static_cast<size_t>(n * c.rows));
    backend->Linear(x.data(), n, w, nullptr, out.data());
    ExpectClose(out, Reference(*m, x, n), x, c.cols, "n=" + std::to_string(n));
  }
}

// Each row of a Linear over `n` rows (2 to 8 stream their weights as one row does, 11 run the
// tiles) is the bits of a one-row Linear over it.
void ExpectEveryBatchGivesOneRowsBits(Backend& backend, const DeviceWeight& w, const Case& c,
                                      uint32_t seed) {
  for (int64_t n : {2, 3, 5, 7, 8, 11}) {
    const std::vector<float> x = Random(n * c.cols, seed + static_cast<uint32_t>(n));
    std::vector<float> all(static_cast<size_t>(n * c.rows)), one(static_cast<size_t>(c.rows));
    backend.Linear(x.data(), n, w, nullptr, all.data());
    for (int64_t i = 0; i < n; ++i) {
      backend.Linear(x.data() + i * c.cols, 1, w, nullptr, one.data());
      for (int64_t r = 0; r < c.rows; ++r) {
        ASSERT_EQ(one[r], all[i * c.rows + r]) << "n=" << n << ", row " << i << ", col " << r;
      }
    }
  }
}

TEST_P(QuantLinearTest, RowsAreBatchInvariant) {
  const Case& c = GetParam();
  auto backend = CpuBackend::Create({}).value();
  const DeviceWeight w = backend->UploadQuantizedWeight(Make()).value();
  ExpectEveryBatchGivesOneRowsBits(*backend, w, c, 7);
}

TEST_P(QuantLinearTest, GemmPathAndPortablePathAgree) {
  const Case& c = GetParam();
  auto m = Make();
  // Without batch invariance, 9+ rows dequantize tiles into SGEMM.
  auto gemm = CpuBackend::Create({nullptr, /*batch_invariant=*/false}).value();
  const DeviceWeight w = gemm->UploadQuantizedWeight(m).value();
  const int64_t n = 12;
  const std::vector<float> x = Random(n * c.cols, 8);
  std::vector<float> out(static_cast<size_t>(n * c.rows));
  gemm->Linear(x.data(), n, w, nullptr, out.data());
  const std::vector<double> want = Reference(*m, x, n);
  ExpectClose(out, want, x, c.cols, "gemm");
  // The portable kernel, called directly (machines without AVX-512 run it), on stored-order x.
  if (!c.permuted) {
    const cpu::QuantRows q = cpu::QuantRowsOf(*m);
    std::vector<float> sums(static_cast<size_t>(n * q.groups));
    std::vector<const float*> xs, ss;
    for (int64_t i = 0; i < 3; ++i) {
      cpu::QuantGroupSums(x.data() + i * c.cols, c.cols, q.group_size, &sums[i * q.groups]);
      xs.push_back(x.data() + i * c.cols);
      ss.push_back(&sums[i * q.groups]);
    }
    std::vector<float> portable(static_cast<size_t>(3 * c.rows));
    cpu::QuantDotTilePortable(xs.data(), 3, ss.data(), q, static_cast<int>(c.rows), portable.data(),
                              c.rows);
    ExpectClose(portable, std::vector<double>(want.begin(), want.begin() + 3 * c.rows), x, c.cols,
                "portable");
  }
}

// --activation-dtype int8: x as the kernels quantize it, written here from the documented rule
// (quant_a8_kernels.h): in stored column order, blocks of the group (128 when the group is a
// larger multiple of 128 or the whole row), sx = max|x| / 127, xq = round(x / sx); back in input
// column order as xq · sx.
std::vector<float> Int8Activations(const QuantizedMatrix& m, const std::vector<float>& x,
                                   int64_t n) {
  const int64_t cols = m.cols, g = m.group_size;
  const int64_t block = g > 128 && (g % 128 == 0 || g >= cols) ? 128 : g;
  std::vector<float> out(x.size());
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> stored(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) stored[c] = x[i * cols + (m.perm.empty() ? c : m.perm[c])];
    for (int64_t c0 = 0; c0 < cols; c0 += block) {
      const int64_t c1 = std::min(cols, c0 + block);
      float amax = 0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(stored[c]));
      const float sx = amax / 127;
      for (int64_t c = c0; c < c1; ++c) stored[c] = std::nearbyint(stored[c] / sx) * sx;
    }
    for (int64_t c = 0; c < cols; ++c) out[i * cols + (m.perm.empty() ? c : m.perm[c])] = stored[c];
  }
  return out;
}

TEST_P(QuantLinearTest, Int8ActivationsComputeTheDocumentedProducts) {
  const Case& c = GetParam();
  CpuBackend::Options options;
  options.activations = ActivationDType::kInt8;
  auto backend = CpuBackend::Create(options).value();
  auto m = Make();
  const DeviceWeight w = backend->UploadQuantizedWeight(m).value();
  for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17}) {
    const std::vector<float> x = Random(n * c.cols, 200 + n);
    std::vector<float> out(static_cast<size_t>(n * c.rows));
    backend->Linear(x.data(), n, w, nullptr, out.data());
    ExpectClose(out, Reference(*m, Int8Activations(*m, x, n), n), x, c.cols,
                "int8 activations, n=" + std::to_string(n));
  }
  // Batch invariance holds as on the f32 path.
  ExpectEveryBatchGivesOneRowsBits(*backend, w, c, 9);
  const int64_t n = 11;
  const std::vector<float> x = Random(n * c.cols, 9);
  // The portable kernel (CPUs without VNNI), on stored-order x.
  if (!c.permuted) {
    const cpu::QuantRows q = cpu::QuantRowsOf(*m);
    cpu::QuantizedActivations a;
    cpu::QuantizeActivations(x.data(), 3, q, &a);
    std::vector<float> portable(static_cast<size_t>(3 * c.rows));
    cpu::QuantDotTileA8Portable(a, 0, 3, q, static_cast<int>(c.rows), portable.data(), c.rows);
    ExpectClose(portable, Reference(*m, Int8Activations(*m, x, 3), 3), x, c.cols,
                "int8 activations, portable");
  }
}

// One input's projections read as one job at batch 1 (LinearEach): each output is its own
// Linear's bits, with the case's matrix between two of other row counts and a bias on the last, on
// both activation paths; the same at three rows (streamed together too). Act-order weights each
// have a column order of their own, which LinearEach reads a Linear at a time.
TEST_P(QuantLinearTest, ProjectionsReadAsOneGiveEachLinearsBits) {
  const Case& c = GetParam();
  for (ActivationDType act : {ActivationDType::kF32, ActivationDType::kInt8}) {
    CpuBackend::Options options;
    options.activations = act;
    auto backend = CpuBackend::Create(options).value();
    const int64_t rows[] = {7, c.rows, c.rows / 2 + 20};
    std::vector<DeviceWeight> ws;
    std::vector<std::vector<float>> outs;
    for (int i = 0; i < 3; ++i) {
      ws.push_back(backend->UploadQuantizedWeight(Make(rows[i], 40 + i)).value());
      outs.emplace_back(3 * rows[i]);
    }
    std::vector<float> bias_v = Random(rows[2], 43);
    const DeviceWeight bias{DType::kF32, 1, rows[2], bias_v.data(), nullptr};
    const Backend::Projection ps[] = {{&ws[0], nullptr, outs[0].data()},
                                      {&ws[1], nullptr, outs[1].data()},
                                      {&ws[2], &bias, outs[2].data()}};
    const std::vector<float> x = Random(3 * c.cols, 44);
    for (int64_t n : {1, 3}) {
      ASSERT_TRUE(test_support::LinearEachGivesEachLinearsBits(
          *backend, x.data(), n, ps,
          act == ActivationDType::kInt8 ? "int8 activations" : "f32 activations"));
    }
  }
}

// The vectorized activation quantization gives the portable code's bits: block sizes with and
// without 16-column tails, int4's slot order, ties, NaN and infinities (a NaN is skipped by the
// block's maximum and becomes 127; an infinite maximum gives scale 1).
TEST(QuantA8Test, VectorActivationQuantizationIsThePortableBits) {
  struct Shape {
    QuantType type;
    int64_t cols, group;
  };
  for (const Shape& shape : {Shape{QuantType::kInt8, 131, 131}, Shape{QuantType::kInt8, 300, 100},
                             Shape{QuantType::kInt4, 320, 128}, Shape{QuantType::kInt4, 192, 32},
                             Shape{QuantType::kInt4, 512, 512}}) {
    cpu::QuantRows q;
    q.type = shape.type;
    q.cols = shape.cols;
    q.group_size = shape.group;
    q.groups = (shape.cols + shape.group - 1) / shape.group;
    const int64_t rows = 4;
    std::vector<float> x = Random(rows * shape.cols, 17);
    x[3] = std::nanf("");
    x[shape.cols + 5] = std::numeric_limits<float>::infinity();
    x[2 * shape.cols + 1] = -0.f;
    x[2 * shape.cols + 2] = 1e30f;
    x[2 * shape.cols + 3] = 1e-40f;  // subnormal
    for (int64_t c = 0; c < 16; ++c) x[3 * shape.cols + c] = 0.5f * static_cast<float>(c) - 4.f;
    x[3 * shape.cols + 16] = 127.f;  // ties: x / s lands on halves in that block
    cpu::QuantizedActivations vec, portable;
    cpu::QuantizeActivations(x.data(), rows, q, &vec);
    cpu::QuantizeActivationsPortable(x.data(), rows, q, &portable);
    const std::string what = absl::StrCat(std::string(QuantTypeName(shape.type)), " cols ",
                                          shape.cols, " group ", shape.group);
    EXPECT_EQ(vec.block_size, portable.block_size) << what;
    EXPECT_EQ(vec.q, portable.q) << what;
    EXPECT_EQ(vec.sum, portable.sum) << what;
    ASSERT_EQ(vec.scale.size(), portable.scale.size()) << what;
    for (size_t i = 0; i < vec.scale.size(); ++i)
      EXPECT_EQ(vec.scale[i], portable.scale[i]) << what << " block " << i;
    EXPECT_EQ(portable.row(0)[3], 127) << what << ": NaN";
    EXPECT_EQ(portable.scales(1)[0], 1.f) << what << ": an infinite maximum";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, QuantLinearTest,
    ::testing::Values(Case{QuantType::kInt8, 37, 256, 0, true, false},
                      Case{QuantType::kInt8, 29, 200, 64, false, false},  // tails of 8 and 16
                      Case{QuantType::kInt8, 40, 131, 0, true, false},    // odd width
                      Case{QuantType::kInt8, 30, 256, 128, false, true},
                      Case{QuantType::kInt4, 37, 256, 128, false, false},
                      Case{QuantType::kInt4, 26, 320, 128, false, false},  // ragged last group
                      Case{QuantType::kInt4, 33, 192, 32, true, false},
                      Case{QuantType::kInt4, 31, 256, 64, false, true},
                      Case{QuantType::kInt4, 9, 512, 0, false, false},  // one group per row
                      // Batch 1 streams runs of rows side by side: several runs a thread.
                      Case{QuantType::kInt8, 517, 200, 64, false, false},
                      Case{QuantType::kInt4, 603, 256, 128, false, false},
                      Case{QuantType::kInt4, 45, 512, 256, false, false}),  // two blocks a group
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return std::string(QuantTypeName(c.type)) + "_" + std::to_string(c.rows) + "x" +
             std::to_string(c.cols) + "_g" + std::to_string(c.group) +
             (c.symmetric ? "_sym" : "_asym") + (c.permuted ? "_perm" : "");
    });

TEST(QuantUploadTest, DefaultUploadDequantizesForBackendsWithoutKernels) {
  // The Backend default (what a backend without quantized kernels gets): an f32 weight.
  auto cpu = CpuBackend::Create({}).value();
  const std::vector<float> w = Random(4 * 64, 9);
  auto m = std::make_shared<QuantizedMatrix>(
      QuantizeRtn(w.data(), 4, 64, DefaultRtnOptions(QuantType::kInt4)));
  const DeviceWeight dw = cpu->Backend::UploadQuantizedWeight(m).value();
  EXPECT_EQ(dw.quant, QuantType::kNone);
  EXPECT_EQ(dw.dtype, DType::kF32);
  const std::vector<float> d = Dequantize(*m);
  const auto* values = static_cast<const float*>(dw.data);
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(values[i], d[i]);
}

TEST(QuantUploadTest, CpuRefusesAnInvalidMatrix) {
  auto cpu = CpuBackend::Create({}).value();
  auto m = std::make_shared<QuantizedMatrix>(MakeQuantizedMatrix(QuantType::kInt8, 2, 8, 8));
  m->scales.pop_back();
  EXPECT_EQ(cpu->UploadQuantizedWeight(m).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
