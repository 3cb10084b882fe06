// Quantized Hugging Face checkpoints read unchanged: GPTQ (AutoGPTQ / GPTQModel), AWQ (AutoAWQ,
// GEMM version) and compressed-tensors (llm-compressor, pack-quantized), detected from
// config.json's quantization_config, each Linear turned into Tandem's layout
// (quantized_matrix.h) without changing what it means:
//
//   GPTQ   prefix.qweight int32 [K·b/32][N] packed along K (field j of word [r][n]: input k =
//          r·32/b + j), prefix.qzeros int32 [G][N·b/32] packed along N, prefix.scales [G][N],
//          prefix.g_idx int32 [K] (the group of each input column; act-order when not k / group).
//          checkpoint_format "gptq" (or absent) stores zero − 1; "gptq_v2" stores the zero.
//   AWQ    prefix.qweight int32 [K][N/8] and prefix.qzeros int32 [G][N/8] packed along N in the
//          interleaved order (nibble i of a word holds column 8c + {0,2,4,6,1,3,5,7}[i]),
//          prefix.scales [G][N]; 4 bits; zero points as stored.
//   compressed-tensors  prefix.weight_packed int32 [N][ceil(K·b/32)] packed along K in
//          offset binary (stored = q + 2^(b−1)), prefix.weight_scale [N][G], prefix.weight_shape
//          [2] = {N, K}, optional prefix.weight_zero_point (asymmetric: int32 packed along N in
//          offset binary, [ceil(N·b/32)][G], or int8 [N][G] unpacked) and prefix.weight_g_idx [K].
//
// where K = in_features, N = out_features, b = bits (4 or 8), G = groups. Every value a field can
// hold is representable (zero points are f32); what a checkpoint can get wrong (shapes, packing
// that does not divide, bits or methods not supported, a group size that does not divide K, g_idx
// out of range or whose groups are not of one size) is refused naming the tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/quant/quantized_matrix.h"
#include "common/tensor/safetensors.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem {

enum class CheckpointFormat : uint8_t { kNone, kGptq, kAwq, kCompressedTensors };

// "none", "gptq", "awq", "compressed-tensors".
std::string_view CheckpointFormatName(CheckpointFormat f);

struct CheckpointQuantization {
  CheckpointFormat format = CheckpointFormat::kNone;
  int bits = 0;
  int64_t group_size = -1;  // -1: one group over all input columns
  bool symmetric = true;
  bool gptq_v2 = false;  // GPTQ: zero points stored as they are (else stored as zero − 1)
  bool desc_act = false;
};

// config.json's "quantization_config" (the object, or null/absent → kNone). INVALID_ARGUMENT
// naming the field for a method, format, bit width or layout Tandem does not read.
absl::StatusOr<CheckpointQuantization> ParseQuantizationConfig(const nlohmann::json& config);

// The tensor names of `prefix` (e.g. "model.layers.0.mlp.up_proj") that hold a quantized Linear
// in this format; empty when the checkpoint stores it unquantized (prefix.weight: GPTQ's and
// AWQ's modules_to_not_convert, compressed-tensors' ignore list).
std::vector<std::string> QuantizedTensorNames(const Checkpoint& checkpoint,
                                              const CheckpointQuantization& q,
                                              const std::string& prefix);

// The Linear `prefix` of [out_features][in_features] in Tandem's layout.
absl::StatusOr<QuantizedMatrix> ReadQuantizedLinear(const Checkpoint& checkpoint,
                                                    const CheckpointQuantization& q,
                                                    const std::string& prefix, int64_t out_features,
                                                    int64_t in_features);

// QuantizedMatrix::bytes() of what ReadQuantizedLinear gives, from the shapes and g_idx alone.
absl::StatusOr<int64_t> QuantizedLinearBytes(const Checkpoint& checkpoint,
                                             const CheckpointQuantization& q,
                                             const std::string& prefix, int64_t out_features,
                                             int64_t in_features);

// Matrices of one input stacked by rows (q|k|v, gate|up): one type, group size and column
// order. INVALID_ARGUMENT naming `what` when they differ (act-order g_idx that is not the same
// for all of them).
absl::StatusOr<QuantizedMatrix> StackQuantizedRows(const std::vector<QuantizedMatrix>& parts,
                                                   const std::string& what);

}  // namespace tandem
