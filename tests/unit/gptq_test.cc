// GPTQ (common/quant/gptq.h) and the checkpoint writers (common/quant/checkpoint_packing.h).
//
// GPTQ is held to what it promises: with an identity Hessian nothing spreads and it is RTN
// exactly; on correlated inputs its output error X(W − Q)ᵀ is well below RTN's; act-order takes
// columns in decreasing H[i][i]; dead inputs get weight 0; the Hessian accumulator is Xᵀ X. The
// writers are the readers' inverse: every layout Tandem writes reads back (checkpoint_formats.h,
// itself tested against an independent packer) to the same weights, and what a format cannot
// hold is refused.
#include "common/quant/gptq.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "common/quant/checkpoint_formats.h"
#include "common/quant/checkpoint_packing.h"
#include "common/quant/rtn.h"
#include "common/tensor/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::vector<float> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& v : w) v = d(rng);
  return w;
}

// Inputs with strongly correlated, unequally scaled features, as a layer's activations are:
// x = z · A with z standard normal, A [cols][cols] random with decaying column scales.
std::vector<float> CorrelatedInputs(int64_t n, int64_t cols, uint32_t seed) {
  const std::vector<float> z = RandomMatrix(n, cols / 4, seed);
  const std::vector<float> a = RandomMatrix(cols / 4, cols, seed + 1);
  std::vector<float> x(static_cast<size_t>(n * cols), 0.f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < cols / 4; ++k) {
      for (int64_t c = 0; c < cols; ++c) {
        x[i * cols + c] += z[i * (cols / 4) + k] * a[k * cols + c] * (1.f + 4.f * (c % 7 == 0));
      }
    }
  }
  return x;
}

std::vector<double> HessianOf(const std::vector<float>& x, int64_t n, int64_t cols) {
  HessianAccumulator acc(cols);
  acc.Add(x.data(), n / 2);
  acc.Add(x.data() + (n / 2) * cols, n - n / 2);
  EXPECT_EQ(acc.rows_seen(), n);
  return acc.Hessian();
}

GptqOptions Int4(int64_t group, bool symmetric) {
  GptqOptions o;
  o.grid.type = QuantType::kInt4;
  o.grid.group_size = group;
  o.grid.symmetric = symmetric;
  return o;
}

TEST(HessianAccumulatorTest, IsXTransposeX) {
  const int64_t n = 37, cols = 24;
  const std::vector<float> x = RandomMatrix(n, cols, 1);
  const std::vector<double> h = HessianOf(x, n, cols);
  for (int64_t i = 0; i < cols; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double want = 0;
      for (int64_t r = 0; r < n; ++r) want += double{x[r * cols + i]} * x[r * cols + j];
      EXPECT_NEAR(h[i * cols + j], want, 1e-4 * (1 + std::abs(want))) << i << "," << j;
    }
  }
}

TEST(GptqTest, IdentityHessianIsRoundToNearest) {
  const int64_t rows = 16, cols = 128;
  const std::vector<float> w = RandomMatrix(rows, cols, 2);
  std::vector<double> h(static_cast<size_t>(cols * cols), 0.0);
  for (int64_t i = 0; i < cols; ++i) h[i * cols + i] = 1.0;
  for (bool symmetric : {true, false}) {
    for (QuantType type : {QuantType::kInt4, QuantType::kInt8}) {
      GptqOptions o = Int4(32, symmetric);
      o.grid.type = type;
      const QuantizedMatrix g = QuantizeGptq(w.data(), rows, cols, h, o).value();
      const QuantizedMatrix r = QuantizeRtn(w.data(), rows, cols, o.grid);
      EXPECT_EQ(g.codes, r.codes);
      EXPECT_EQ(g.scales, r.scales);
      EXPECT_EQ(g.zeros, r.zeros);
    }
  }
}

TEST(GptqTest, BeatsRoundToNearestOnCorrelatedInputs) {
  const int64_t rows = 64, cols = 256, n = 1024;
  const std::vector<float> w = RandomMatrix(rows, cols, 3);
  const std::vector<double> h = HessianOf(CorrelatedInputs(n, cols, 4), n, cols);
  for (bool act_order : {false, true}) {
    for (bool symmetric : {true, false}) {
      GptqOptions o = Int4(64, symmetric);
      o.act_order = act_order;
      const QuantizedMatrix g = QuantizeGptq(w.data(), rows, cols, h, o).value();
      ASSERT_TRUE(Validate(g, "gptq").ok());
      EXPECT_EQ(g.perm.empty(), !act_order);
      const double gptq_error = RelativeOutputError(w.data(), g, h);
      const double rtn_error =
          RelativeOutputError(w.data(), QuantizeRtn(w.data(), rows, cols, o.grid), h);
      EXPECT_LT(gptq_error, 0.6 * rtn_error)
          << "act_order " << act_order << " symmetric " << symmetric;
      EXPECT_GT(gptq_error, 0);
    }
  }
}

TEST(GptqTest, ActOrderTakesTheLargestDiagonalFirstAndDeadInputsAreZero) {
  const int64_t rows = 8, cols = 64;
  const std::vector<float> w = RandomMatrix(rows, cols, 5);
  std::vector<double> h(static_cast<size_t>(cols * cols), 0.0);
  for (int64_t i = 0; i < cols; ++i) h[i * cols + i] = i == 5 ? 0.0 : 1.0 + (i * 37 % 64);
  GptqOptions o = Int4(32, false);
  o.act_order = true;
  const QuantizedMatrix m = QuantizeGptq(w.data(), rows, cols, h, o).value();
  ASSERT_EQ(static_cast<int64_t>(m.perm.size()), cols);
  for (int64_t c = 1; c < cols; ++c) {
    EXPECT_GE(h[m.perm[c - 1] * cols + m.perm[c - 1]], h[m.perm[c] * cols + m.perm[c]]);
  }
  EXPECT_EQ(m.perm.back(), 5);  // the dead input, H[5][5] = 0, last
  const std::vector<float> deq = Dequantize(m);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(deq[r * cols + 5], 0.f) << r;
}

// Projections of one input (q, k, v) share one factor of its Hessian: each gets the codes it gets
// from the Hessian itself; a factor of another width is refused.
TEST(GptqTest, ProjectionsOfOneInputShareAFactor) {
  const int64_t cols = 64, n = 256;
  const std::vector<double> h = HessianOf(CorrelatedInputs(n, cols, 8), n, cols);
  GptqOptions o = Int4(32, false);
  o.act_order = true;
  const GptqFactor f = FactorGptq(h, cols, o).value();
  for (int seed : {11, 12, 13}) {
    const int64_t rows = 8 + seed;
    const std::vector<float> w = RandomMatrix(rows, cols, seed);
    const QuantizedMatrix alone = QuantizeGptq(w.data(), rows, cols, h, o).value();
    const QuantizedMatrix shared = QuantizeGptq(w.data(), rows, cols, f, o).value();
    EXPECT_EQ(shared.codes, alone.codes) << seed;
    EXPECT_EQ(shared.scales, alone.scales) << seed;
    EXPECT_EQ(shared.zeros, alone.zeros) << seed;
    EXPECT_EQ(shared.perm, alone.perm) << seed;
  }
  const std::vector<float> w = RandomMatrix(4, 32, 14);
  EXPECT_EQ(QuantizeGptq(w.data(), 4, 32, f, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GptqTest, RefusesAHessianThatCannotBeMadePositiveDefinite) {
  const int64_t cols = 32;
  const std::vector<float> w = RandomMatrix(4, cols, 6);
  std::vector<double> h(static_cast<size_t>(cols * cols), 0.0);
  for (int64_t i = 0; i < cols; ++i) h[i * cols + i] = -1.0;
  const auto m = QuantizeGptq(w.data(), 4, cols, h, Int4(32, true));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(m.status().message(), HasSubstr("positive definite"));
  EXPECT_FALSE(QuantizeGptq(w.data(), 4, cols, std::vector<double>(5), Int4(32, true)).ok());
}

TEST(RtnGridTest, ScalesRoundToTheStoredDtypeAndTheOriginalGptqZeroStaysAboveTheLowestCode) {
  const std::vector<float> w = {0.1f, 0.37f, 0.9f, 0.0013f};  // all ≥ 0: RTN's zero is code 0
  RtnOptions o;
  o.type = QuantType::kInt4;
  o.symmetric = false;
  EXPECT_EQ(RtnGrid(w.data(), 4, 1, o).zero, 0.f);
  o.scale_dtype = DType::kF16;
  o.zero_above_min_code = true;
  const QuantGrid g = RtnGrid(w.data(), 4, 1, o);
  EXPECT_EQ(g.zero, 1.f);
  EXPECT_EQ(F16ToF32(F32ToF16(g.scale)), g.scale);
  for (float v : w) EXPECT_LE(std::abs(g.Value(g.Code(v)) - v), g.scale / 2 + 1e-6f) << v;
}

// --- Writers: pack, write, read back ---

struct PackCase {
  CheckpointFormat format;
  int bits;
  int64_t group;  // -1: per channel
  bool symmetric;
  bool v2;
  bool act_order;
};

std::string CaseName(const ::testing::TestParamInfo<PackCase>& info) {
  const PackCase& c = info.param;
  return absl::StrCat(c.format == CheckpointFormat::kGptq ? (c.v2 ? "gptqv2" : "gptq") : "ct", "_",
                      c.bits, "bit_g", c.group > 0 ? c.group : 0, c.symmetric ? "_sym" : "_asym",
                      c.act_order ? "_act" : "");
}

class PackTest : public ::testing::TestWithParam<PackCase> {};

TEST_P(PackTest, ReadsBackAsTheSameWeights) {
  const PackCase& c = GetParam();
  const int64_t rows = 64, cols = 256, n = 512;
  const std::vector<float> w = RandomMatrix(rows, cols, 7);
  CheckpointQuantization q;
  q.format = c.format;
  q.bits = c.bits;
  q.group_size = c.group;
  q.symmetric = c.symmetric;
  q.gptq_v2 = c.v2;
  q.desc_act = c.act_order;
  GptqOptions o;
  o.grid.type = c.bits == 8 ? QuantType::kInt8 : QuantType::kInt4;
  o.grid.group_size = c.group > 0 ? c.group : 0;
  o.grid.symmetric = c.symmetric;
  o.grid.zero_above_min_code = c.format == CheckpointFormat::kGptq && !c.v2;
  const DType scale_dtype = c.format == CheckpointFormat::kGptq ? DType::kF16 : DType::kBF16;
  o.grid.scale_dtype = scale_dtype;
  o.act_order = c.act_order;
  const QuantizedMatrix m =
      QuantizeGptq(w.data(), rows, cols, HessianOf(CorrelatedInputs(n, cols, 8), n, cols), o)
          .value();
  const std::vector<PackedTensor> packed =
      PackQuantizedLinear(m, q, scale_dtype, "model.layers.0.mlp.up_proj").value();

  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("pack_" + CaseName(::testing::TestParamInfo<PackCase>(c, 0)));
  fs::create_directories(dir);
  std::vector<TensorToWrite> tensors;
  for (const PackedTensor& p : packed) {
    TensorToWrite t{"model.layers.0.mlp.up_proj" + p.suffix, p.dtype, p.shape, {}};
    t.data.resize(p.bytes.size());
    std::memcpy(t.data.data(), p.bytes.data(), p.bytes.size());
    tensors.push_back(std::move(t));
  }
  ASSERT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), tensors).ok());
  auto ckpt = Checkpoint::Open(dir.string()).value();
  // The config written for the format parses back to it.
  const CheckpointQuantization parsed =
      ParseQuantizationConfig(QuantizationConfigJson(q, {"lm_head"})).value();
  EXPECT_EQ(parsed.format, q.format);
  EXPECT_EQ(parsed.bits, q.bits);
  EXPECT_EQ(parsed.group_size, q.group_size);
  EXPECT_EQ(parsed.symmetric, q.symmetric);
  EXPECT_EQ(parsed.gptq_v2, q.gptq_v2);
  EXPECT_FALSE(QuantizedTensorNames(*ckpt, parsed, "model.layers.0.mlp.up_proj").empty());
  const QuantizedMatrix back =
      ReadQuantizedLinear(*ckpt, parsed, "model.layers.0.mlp.up_proj", rows, cols).value();
  EXPECT_EQ(Dequantize(back), Dequantize(m));
}

INSTANTIATE_TEST_SUITE_P(
    Formats, PackTest,
    ::testing::Values(PackCase{CheckpointFormat::kGptq, 4, 128, true, false, false},
                      PackCase{CheckpointFormat::kGptq, 4, 32, false, false, false},
                      PackCase{CheckpointFormat::kGptq, 4, 64, false, true, true},
                      PackCase{CheckpointFormat::kGptq, 8, -1, true, false, false},
                      PackCase{CheckpointFormat::kGptq, 8, 128, false, false, true},
                      PackCase{CheckpointFormat::kCompressedTensors, 4, 128, true, false, false},
                      PackCase{CheckpointFormat::kCompressedTensors, 4, 32, false, false, true},
                      PackCase{CheckpointFormat::kCompressedTensors, 8, -1, true, false, false},
                      PackCase{CheckpointFormat::kCompressedTensors, 8, 64, false, false, false}),
    CaseName);

TEST(PackRefusalTest, WhatAFormatCannotHoldIsRefusedNamingTheTensor) {
  const int64_t rows = 8, cols = 64;
  const std::vector<float> w = RandomMatrix(rows, cols, 9);
  RtnOptions grid;
  grid.type = QuantType::kInt4;
  grid.group_size = 32;
  grid.symmetric = false;
  grid.scale_dtype = DType::kF16;
  CheckpointQuantization q;
  q.format = CheckpointFormat::kGptq;
  q.bits = 4;
  q.group_size = 32;
  q.symmetric = false;
  auto expect_refused = [&](const QuantizedMatrix& m, const CheckpointQuantization& fmt,
                            DType scale_dtype, const std::string& why) {
    const auto p = PackQuantizedLinear(m, fmt, scale_dtype, "layers.0.q_proj");
    ASSERT_FALSE(p.ok()) << why;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(p.status().message(), HasSubstr("layers.0.q_proj"));
    EXPECT_THAT(p.status().message(), HasSubstr(why));
  };
  QuantizedMatrix m = QuantizeRtn(w.data(), rows, cols, grid);
  ASSERT_TRUE(PackQuantizedLinear(m, q, DType::kF16, "x").ok());
  QuantizedMatrix low_zero = m;
  low_zero.zeros[3] = 0;  // the original GPTQ storage holds zero − 1
  expect_refused(low_zero, q, DType::kF16, "zero - 1");
  QuantizedMatrix odd_zero = m;
  odd_zero.zeros[1] = 2.5f;
  expect_refused(odd_zero, q, DType::kF16, "zero point");
  QuantizedMatrix fine_scale = m;
  fine_scale.scales[0] = 1.0f + 1e-6f;
  expect_refused(fine_scale, q, DType::kF16, "not exact in F16");
  CheckpointQuantization other_group = q;
  other_group.group_size = 64;
  expect_refused(m, other_group, DType::kF16, "groups of 32");
  CheckpointQuantization eight = q;
  eight.bits = 8;
  expect_refused(m, eight, DType::kF16, "8-bit");
  CheckpointQuantization symmetric_ct = q;
  symmetric_ct.format = CheckpointFormat::kCompressedTensors;
  symmetric_ct.symmetric = true;
  expect_refused(m, symmetric_ct, DType::kF16, "symmetric");
  CheckpointQuantization awq = q;
  awq.format = CheckpointFormat::kAwq;
  expect_refused(m, awq, DType::kF16, "cannot write");
}

}  // namespace
}  // namespace tandem
