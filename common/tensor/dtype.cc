#include "common/tensor/dtype.h"

#include <cctype>
#include <cmath>
#include <string>

namespace tandem {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI8: return "I8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kF8E4M3: return "F8_E4M3";
  }
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I8") return DType::kI8;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  return std::nullopt;
}

bool ParseKvCacheDType(std::string_view text, std::optional<DType>* out) {
  std::string upper(text);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper == "AUTO") {
    *out = std::nullopt;
    return true;
  }
  if (upper == "INT8" || upper == "I8") {
    *out = DType::kI8;
    return true;
  }
  if (upper == "FP8" || upper == "FP8_E4M3") {
    *out = DType::kF8E4M3;
    return true;
  }
  const std::optional<DType> d = ParseDType(upper);
  if (!d.has_value() || !IsFloat(*d)) return false;
  *out = d;
  return true;
}

std::string_view KvCacheDTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI8: return "int8";
    case DType::kF8E4M3: return "fp8";
    default: return DTypeName(t);
  }
}

float F8E4M3ToF32(uint8_t b) {
  const int exp = (b >> 3) & 0xf, mant = b & 7;
  const float sign = (b & 0x80) != 0 ? -1.f : 1.f;
  if (exp == 0xf && mant == 7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);  // subnormal: m/8 · 2^-6
  return sign * std::ldexp(static_cast<float>(8 + mant), exp - 10);      // (1 + m/8) · 2^(e-7)
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? std::nanf("") : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t F32ToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t absx = x & 0x7fffffff;
  if (absx > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00);   // NaN
  if (absx >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // overflow → inf
  if (absx < 0x38800000) {                                              // subnormal or zero in f16
    const float a = std::fabs(f);
    const float scaled = a * 16777216.0f;  // 2^24
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  const uint32_t exp = ((absx >> 23) - 112) << 10;
  uint32_t mant = absx & 0x7fffff;
  uint32_t h = exp | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

void ConvertToF32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kI8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kI32: {
      for (size_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, static_cast<const std::byte*>(src) + 4 * i, 4);
        dst[i] = static_cast<float>(v);
      }
      return;
    }
    case DType::kI64: {
      for (size_t i = 0; i < n; ++i) {
        int64_t v;
        std::memcpy(&v, static_cast<const std::byte*>(src) + 8 * i, 8);
        dst[i] = static_cast<float>(v);
      }
      return;
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F8E4M3ToF32(s[i]);
      return;
    }
  }
}

}  // namespace tandem
