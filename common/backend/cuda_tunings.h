// The CUDA backend's tunings: choices GPU runs decide (docs/benchmarks.md), each the same bits
// either way except where said. Set by flags (--cuda-*, common/serving/engine_flags.cc) through
// BackendOptions and CudaBackend::Options; a TANDEM_CUDA_* environment variable, when set,
// overrides its field (benchmarks compare both settings that way). Plain data: it crosses the CUDA
// plugin's C entry point as it is.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <tuple>

#include "absl/status/status.h"

namespace tandem {

struct CudaTunings {
  // Fusions: bias and silu·up in the GEMV; the q|k|v split, q/k norms, RoPE and the cache write in
  // one kernel. --cuda-fusion, TANDEM_CUDA_FUSION=0|1.
  bool fusion = true;
  // The norms and residual adds inside the GEMV (each GEMV block recomputes its rows' norm), under
  // fusion. --cuda-gemv-norm, TANDEM_CUDA_GEMV_NORM=0|1.
  bool gemv_norm = true;
  // The q|k|v prologue run by the q|k|v GEMV's last block of each head, under fusion (else its own
  // kernel after the GEMV). --cuda-gemv-heads, TANDEM_CUDA_GEMV_HEADS=0|1.
  bool gemv_heads = true;
  // Prompt attention on the tensor cores (queries and probabilities rounded to the cache's 16-bit
  // type: not the same bits). --cuda-tc-attention, TANDEM_CUDA_TC_ATTENTION=1.
  bool tensor_core_attention = false;
  // Output columns a GEMV warp computes: 1, 2 or 4. --cuda-gemv-columns, TANDEM_CUDA_GEMV_COLUMNS.
  int gemv_columns = 1;
  // Keys of a split where attention's splits take blocks of their own: 32, 64, 128 or 256 (always
  // 256 batch-invariant). --cuda-grid-split-keys, TANDEM_CUDA_GRID_SPLIT_KEYS.
  int grid_split_keys = 256;
  // Programmatic dependent launch (compute capability 9 on; one setting per process, the first
  // backend's). --cuda-pdl, TANDEM_CUDA_PDL=1.
  bool programmatic_launch = false;
  // Per-op device time (SetOpProfiling), from the start. --cuda-op-profile,
  // TANDEM_CUDA_OP_PROFILE=1.
  bool op_profile = false;
};

// The values gemv_columns and grid_split_keys may take.
inline constexpr int kCudaGemvColumns[] = {1, 2, 4};
inline constexpr int kCudaGridSplitKeys[] = {32, 64, 128, 256};

// "1, 2 or 4": the choices as an error message lists them.
inline std::string ChoicesText(std::span<const int> choices) {
  std::string text;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) text += i + 1 < choices.size() ? ", " : " or ";
    text += std::to_string(choices[i]);
  }
  return text;
}

// INVALID_ARGUMENT naming the flag for a value outside its choices.
inline absl::Status ValidateCudaTunings(const CudaTunings& t) {
  for (auto [flag, value, choices] :
       {std::tuple<const char*, int, std::span<const int>>{"--cuda-gemv-columns", t.gemv_columns,
                                                           kCudaGemvColumns},
        {"--cuda-grid-split-keys", t.grid_split_keys, kCudaGridSplitKeys}}) {
    if (std::find(choices.begin(), choices.end(), value) == choices.end()) {
      return absl::InvalidArgumentError(std::string(flag) + " must be " + ChoicesText(choices) +
                                        ", not " + std::to_string(value));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
