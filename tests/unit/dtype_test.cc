#include "common/tensor/dtype.h"

#include <cmath>
#include <limits>

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
