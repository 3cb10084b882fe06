// Element types of checkpoint tensors and their conversions to f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { kF32, kF16, kBF16 };

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

// The safetensors spelling: "F32", "F16", "BF16".
std::string_view DTypeName(DType t);
std::optional<DType> ParseDType(std::string_view name);
// --kv-cache-dtype's value: "auto" (any case) sets *out to std::nullopt, "f32", "bf16" or "f16"
// (any case) to that type; false for anything else.
bool ParseKvCacheDType(std::string_view text, std::optional<DType>* out);

inline float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// Converts n elements of type `t` at `src` to f32.
void ConvertToF32(DType t, const void* src, float* dst, size_t n);

}  // namespace tandem
