// DType to and from its protobuf enum (tandem.v1.WeightDType), for the model description and the KV
// transfer handshake, and a KV geometry message's cache type.
#pragma once

#include <cstdint>
#include <optional>

#include "common/tensor/dtype.h"
#include "tandem/v1/model.pb.h"

namespace tandem {

inline v1::WeightDType ToProto(DType t) {
  switch (t) {
    case DType::kF32: return v1::WEIGHT_DTYPE_F32;
    case DType::kF16: return v1::WEIGHT_DTYPE_F16;
    case DType::kBF16: return v1::WEIGHT_DTYPE_BF16;
    case DType::kI8: return v1::WEIGHT_DTYPE_I8;
    case DType::kF8E4M3: return v1::WEIGHT_DTYPE_F8_E4M3;
    default: return v1::WEIGHT_DTYPE_UNSPECIFIED;  // I32/I64 name neither weights nor caches
  }
}

// std::nullopt for UNSPECIFIED and values this build does not know.
inline std::optional<DType> FromProto(v1::WeightDType t) {
  switch (t) {
    case v1::WEIGHT_DTYPE_F32: return DType::kF32;
    case v1::WEIGHT_DTYPE_F16: return DType::kF16;
    case v1::WEIGHT_DTYPE_BF16: return DType::kBF16;
    case v1::WEIGHT_DTYPE_I8: return DType::kI8;
    case v1::WEIGHT_DTYPE_F8_E4M3: return DType::kF8E4M3;
    default: return std::nullopt;
  }
}

// What a KV cache stores, as a KV geometry message names it: its dtype field, which must agree with
// its element size; a sender or worker from before 16-bit caches names none and has 4-byte
// elements: f32. std::nullopt for anything else.
inline std::optional<DType> KvDTypeFromProto(const v1::KvGeometry& g) {
  if (g.dtype() == v1::WEIGHT_DTYPE_UNSPECIFIED && g.bytes_per_element() == 4) return DType::kF32;
  const std::optional<DType> dtype = FromProto(g.dtype());
  if (!dtype.has_value() || static_cast<int64_t>(DTypeSize(*dtype)) != g.bytes_per_element())
    return std::nullopt;
  return dtype;
}

}  // namespace tandem
