// The CUDA backend's tunings: choices GPU runs decide (docs/benchmarks.md), each the same bits
// either way except where said. Set by flags (--cuda-*, common/serving/engine_flags.cc) through
// BackendOptions and CudaBackend::Options; a TANDEM_CUDA_* environment variable, when set,
// overrides its field (benchmarks compare both settings that way). Plain data: it crosses the CUDA
// plugin's C entry point as it is.
#pragma once

#include <string>

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

// INVALID_ARGUMENT naming the flag for a value outside its choices.
inline absl::Status ValidateCudaTunings(const CudaTunings& t) {
  if (t.gemv_columns != 1 && t.gemv_columns != 2 && t.gemv_columns != 4) {
    return absl::InvalidArgumentError("--cuda-gemv-columns must be 1, 2 or 4, not " +
                                      std::to_string(t.gemv_columns));
  }
  if (t.grid_split_keys != 32 && t.grid_split_keys != 64 && t.grid_split_keys != 128 &&
      t.grid_split_keys != 256) {
    return absl::InvalidArgumentError("--cuda-grid-split-keys must be 32, 64, 128 or 256, not " +
                                      std::to_string(t.grid_split_keys));
  }
  return absl::OkStatus();
}

}  // namespace tandem
