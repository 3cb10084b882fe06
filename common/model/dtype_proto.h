// DType to and from its protobuf enum (tandem.v1.WeightDType), for the model description and the KV
// transfer handshake.
#pragma once

#include <optional>

#include "common/model/dtype.h"
#include "tandem/v1/model.pb.h"

namespace tandem {

inline v1::WeightDType ToProto(DType t) {
  switch (t) {
    case DType::kF32: return v1::WEIGHT_DTYPE_F32;
    case DType::kF16: return v1::WEIGHT_DTYPE_F16;
    case DType::kBF16: return v1::WEIGHT_DTYPE_BF16;
  }
  return v1::WEIGHT_DTYPE_UNSPECIFIED;
}

// std::nullopt for UNSPECIFIED and values this build does not know.
inline std::optional<DType> FromProto(v1::WeightDType t) {
  switch (t) {
    case v1::WEIGHT_DTYPE_F32: return DType::kF32;
    case v1::WEIGHT_DTYPE_F16: return DType::kF16;
    case v1::WEIGHT_DTYPE_BF16: return DType::kBF16;
    default: return std::nullopt;
  }
}

}  // namespace tandem
