#include "common/tensor/dtype.h"

#include <cmath>
#include <limits>
#include <optional>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(DTypeTest, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kI32, DType::kI64}) {
    EXPECT_EQ(ParseDType(DTypeName(t)), t);
  }
  EXPECT_TRUE(IsFloat(DType::kBF16));
  EXPECT_FALSE(IsFloat(DType::kI32));
  EXPECT_FALSE(ParseDType("I16").has_value());
  EXPECT_FALSE(ParseDType("U8").has_value());
  EXPECT_FALSE(ParseDType("f32").has_value());
}

// FP8 E4M3 is a KV cache type only: --kv-cache-dtype spells it fp8; no checkpoint tensor is read
// in it. Known values from the OCP FP8 definition (bias 7, no infinities, NaN S.1111.111).
TEST(DTypeTest, Fp8E4M3IsAKvCacheTypeWithKnownValues) {
  std::optional<DType> d;
  for (const char* text : {"fp8", "FP8", "fp8_e4m3"}) {
    ASSERT_TRUE(ParseKvCacheDType(text, &d)) << text;
    EXPECT_EQ(d, DType::kF8E4M3);
  }
  EXPECT_FALSE(ParseKvCacheDType("fp8_e5m2", &d));
  EXPECT_EQ(KvCacheDTypeName(DType::kF8E4M3), "fp8");
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "F8_E4M3");
  EXPECT_FALSE(ParseDType("F8_E4M3").has_value());
  EXPECT_FALSE(IsFloat(DType::kF8E4M3));
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(F8E4M3ToF32(0x38), 1.0f);
  EXPECT_EQ(F8E4M3ToF32(0xb8), -1.0f);
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);                // largest finite
  EXPECT_EQ(F8E4M3ToF32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(F8E4M3ToF32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(F8E4M3ToF32(0x3d), 1.625f);
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0xff)));
  EXPECT_EQ(F8E4M3ToF32(0x78), 256.0f);  // 0.1111.000: no infinity in E4M3
}

TEST(DTypeTest, Bf16KnownValues) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(-2.0f), 0xc000);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  // Round to nearest even: 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7 → 1.
  EXPECT_EQ(F32ToBf16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(F32ToBf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeTest, F16KnownValues) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(1e6f), 0x7c00);                   // overflow → inf
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
}

TEST(DTypeTest, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    if ((v & 0x7c00) == 0x7c00) continue;  // inf / NaN
    ASSERT_EQ(F32ToF16(F16ToF32(v)), v) << std::hex << h;
  }
}

}  // namespace
}  // namespace tandem
