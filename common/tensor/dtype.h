// Element types of checkpoint tensors and their conversions to f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tandem {

// Floating-point types (what weights, activations and KV caches hold) and the integer types of
// quantized checkpoints' packed codes, zero points and indices (I8, I32, I64: read by
// common/quant/ only; IsFloat says which a tensor is). F8E4M3 (OCP FP8 E4M3: 1 sign, 4 exponent
// bits of bias 7, 3 mantissa bits; finite to ±448, no infinity, NaN S.1111.111) is a KV cache type
// only (--kv-cache-dtype fp8, CUDA); no weight is read in it, so IsFloat is false for it.
enum class DType : uint8_t { kF32, kF16, kBF16, kI8, kI32, kI64, kF8E4M3 };

inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kI8:
    case DType::kF8E4M3: return 1;
    case DType::kI64: return 8;
    default: return 4;
  }
}
inline bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// The safetensors spelling: "F32", "F16", "BF16", "I8", "I32", "I64", "F8_E4M3" (ParseDType
// does not take the last: no tensor is read in it).
std::string_view DTypeName(DType t);
std::optional<DType> ParseDType(std::string_view name);
// --kv-cache-dtype's value: "auto" (any case) sets *out to std::nullopt, "f32", "bf16", "f16",
// "int8" ("i8") or "fp8" ("fp8_e4m3"; any case) to that type; false for anything else.
bool ParseKvCacheDType(std::string_view text, std::optional<DType>* out);
// The --kv-cache-dtype spelling of a cache type: "f32", "bf16", "f16", "int8", "fp8".
std::string_view KvCacheDTypeName(DType t);

// An FP8 E4M3 value as f32 (exact).
float F8E4M3ToF32(uint8_t b);

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

// Converts n elements of type `t` at `src` to f32 (integers by value).
void ConvertToF32(DType t, const void* src, float* dst, size_t n);

}  // namespace tandem
