// Tandem's layout (quantized_matrix.h) written as a checkpoint format's tensors: the inverse of
// ReadQuantizedLinear (checkpoint_formats.h, where the layouts are spelled out), for
// `tandem quantize`. GPTQ (original zero − 1 storage or gptq_v2) and compressed-tensors
// pack-quantized; AWQ is read, not written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/quant/checkpoint_formats.h"
#include "common/quant/quantized_matrix.h"
#include "common/tensor/dtype.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem {

// One tensor of a packed Linear: its name is the Linear's prefix + suffix (".qweight", ...).
struct PackedTensor {
  std::string suffix;
  DType dtype = DType::kI32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian, row-major
};

// The tensors of m in format `q` (kGptq or kCompressedTensors), scales stored as `scale_dtype`
// (GPTQ: F16; compressed-tensors: the model's dtype). INVALID_ARGUMENT naming `what` when m cannot
// be written exactly: bits or group size other than q's, a group that does not divide the input
// features, a shape the packing does not divide, a scale its dtype does not hold exactly, a zero
// point that is not an integer in the format's range (the original GPTQ storage cannot hold the
// lowest code), or asymmetric zero points in a symmetric format.
absl::StatusOr<std::vector<PackedTensor>> PackQuantizedLinear(const QuantizedMatrix& m,
                                                              const CheckpointQuantization& q,
                                                              DType scale_dtype,
                                                              const std::string& what);

// config.json's quantization_config for q, as the tools that write each format write it.
// `unquantized`: module names left as stored (e.g. "lm_head"), GPTQ's modules_to_not_convert or
// compressed-tensors' ignore list.
nlohmann::json QuantizationConfigJson(const CheckpointQuantization& q,
                                      const std::vector<std::string>& unquantized);

}  // namespace tandem
