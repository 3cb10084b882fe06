# The forward_bench runs of gpu_check.sh's bench stage, one argument list a line (the model and device
# are added by the caller). Sourced by scripts/gpu_check.sh, which runs them on the GPU, and by
# tests/bench/gpu_runs_test.sh, which runs each on the CUDA emulator with small sizes, so that a flag or
# an output the device run depends on is checked on every machine before a GPU session spends time on it.

# Step "forward": prefill and decode against the device's ceilings, and each tuning side by side.
# DECODE_BATCHES: the plain decode batches (default 1 16 64); FORWARD_TUNINGS=0: those alone (a short lease).
forward_runs() {
  local base="--prompt-len 512 --decode-tokens 64"
  local b gc gk tc smp
  for b in ${DECODE_BATCHES:-1 16 64}; do echo "$base --decode-batch $b"; done
  [[ "${FORWARD_TUNINGS:-1}" == 0 ]] && return 0
  # The same batch-64 decode over an f32 KV cache (the default is the model's BF16).
  echo "$base --decode-batch 64 --kv-cache-dtype f32"
  # Programmatic dependent launch (the default: off) at batches 1 and 64.
  for b in 1 64; do echo "$base --decode-batch $b --pdl"; done
  # The fusions off (the default: on) at batches 1, 8 and 64: the GEMV's bias and silu-mul epilogues,
  # the q|k|v prologue (split, q/k norms, RoPE, cache write) (TANDEM_CUDA_FUSION=0).
  for b in 1 8 64; do echo "$base --decode-batch $b --fusion=false"; done
  # Only the norms and residual adds outside the GEMV again (TANDEM_CUDA_GEMV_NORM=0), at batches 1 and 8.
  for b in 1 8; do echo "$base --decode-batch $b --gemv-norm=false"; done
  # The q|k|v prologue as its own kernel again (TANDEM_CUDA_GEMV_HEADS=0), at batches 1 and 8.
  for b in 1 8; do echo "$base --decode-batch $b --gemv-heads=false"; done
  # GEMV with 1 (the default), 2 and 4 output columns a warp, at batches 1 and 8.
  for b in 1 8; do
    for gc in 1 2 4; do echo "$base --decode-batch $b --gemv-columns $gc"; done
  done
  # Attention's grid splits (batches too small to fill the device) of 64 and 128 keys instead of 256
  # (TANDEM_CUDA_GRID_SPLIT_KEYS): shorter chains of loads a block, more blocks, more to merge.
  for b in 1 8; do
    for gk in 64 128; do echo "$base --decode-batch $b --grid-split-keys $gk"; done
  done
  # BF16 weights cast to F16 at load, GEMM inputs rounded to F16 (--compute-dtype f16; the KV cache
  # follows, as auto): the same tensor-core rate, 8x finer rounding. At batches 1 and 64.
  for b in 1 64; do echo "$base --decode-batch $b --compute-dtype f16"; done
  # GEMM inputs split into two BF16 terms (--split-gemm-inputs): about f32 results, for twice the
  # prefill's GEMM arithmetic; batch 64 runs hi and lo as one GEMM of 128 columns (batch 1's GEMV is
  # unchanged).
  echo "$base --decode-batch 64 --split-gemm-inputs"
  # Long prompts, attention on the CUDA cores against the tensor cores (TANDEM_CUDA_TC_ATTENTION).
  for tc in false true; do echo "--prompt-len 2048 --decode-tokens 8 --decode-batch 1 --tc-attention=$tc"; done
  # Sampled batch-64 decode: every row's logits to the host, against drawing (temperature, min-p) and
  # top-p candidates on the device.
  for smp in host draw nucleus; do echo "$base --decode-batch 64 --sampling $smp"; done
  # Batch 1 without decode graphs.
  echo "$base --decode-batch 1 --cuda-graphs=false"
}

# Step "profile": every op of a prefill and of batch-1, 8 and 64 decode steps, timed (batch 8: the
# GEMV's widest, whose f32 activations every warp re-reads).
profile_runs() {
  local b
  for b in 1 8 64; do echo "--prompt-len 512 --decode-tokens 16 --decode-batch $b --repeats 1 --profile-ops"; done
}
