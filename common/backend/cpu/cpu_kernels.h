// Low-level CPU kernels shared by the CPU backend: dot products over 16-bit weights with AVX2/FMA
// or AVX-512F (chosen at run time; portable fallbacks otherwise) and row conversion.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/tensor/dtype.h"

namespace tandem::cpu {

// A tile of a Linear: out[t * out_stride + r] = x[t] · (w + r * w_row_bytes) for `rows_x`
// activation rows (at most 8) and `rows_w` weight rows; each output is the same bits whatever
// rows_x and rows_w are (batch invariance). With AVX-512 the tile is computed in register blocks of
// several weight rows × the activation rows (one accumulator a pair, its own summation order, not
// the AVX2 path's), so each loaded weight and activation vector feeds several FMAs: a step of a few
// rows (speculative decoding's verification) reads its weights at nearly the cost of one row.
// Without AVX-512, AVX2 (or portable) dot products, one output at a time.
void DotTile(const float* const* x, int rows_x, const void* w, size_t w_row_bytes, int rows_w,
             DType dtype, int64_t n, float* out, int64_t out_stride);
// `rows_x` activation rows x[t] [n] against `rows` consecutive weight rows (w + r * w_row_bytes):
// out[t * out_stride + r] = x[t] · w[r], the same bits as DotTile gives for them. Batch 1's Linear
// and a few rows' (speculative verification), which read each weight once, so their speed is the
// speed the rows stream from memory at: with AVX-512 (up to kStreamedMaxRows activation rows) the
// rows are split into four equal runs (three past six activation rows) read side by side, long
// sequential streams whose dot products are independent chains of FMAs (one row after another is a
// single chain the core waits on; rows side by side in a tile are short streams that jump).
// Elsewhere, DotTile's tiles.
void DotRowsStreamed(const float* const* x, int rows_x, const void* w, size_t w_row_bytes,
                     int64_t rows, DType dtype, int64_t n, float* out, int64_t out_stride);
// The most activation rows DotRowsStreamed streams (three runs × eight rows of accumulators, three
// weight vectors and an activation: 28 of AVX-512's 32 registers; up to six rows, four runs).
inline constexpr int kStreamedMaxRows = 8;
// Calls fn(std::integral_constant<int, T>()) with T = rows (1 to 8; 8 past that): a kernel
// templated on its activation rows, chosen at run time.
template <typename Fn>
void WithRowCount(int rows, const Fn& fn) {
  switch (rows) {
    case 1: return fn(std::integral_constant<int, 1>());
    case 2: return fn(std::integral_constant<int, 2>());
    case 3: return fn(std::integral_constant<int, 3>());
    case 4: return fn(std::integral_constant<int, 4>());
    case 5: return fn(std::integral_constant<int, 5>());
    case 6: return fn(std::integral_constant<int, 6>());
    case 7: return fn(std::integral_constant<int, 7>());
    default: return fn(std::integral_constant<int, 8>());
  }
}
// How far ahead the weight-streaming kernels (16-bit, BF16-activation and quantized) ask for a
// row's bytes, chosen once per process by CPU vendor, as measured (docs/benchmarks.md, "Prefetch
// distance by CPU"): Intel 2 KiB, with batch 1's f32 rows prefetched too; AMD and others 8 KiB,
// batch 1's f32 rows left to the hardware prefetchers. TANDEM_CPU_PREFETCH_BYTES=N (0 to 65536)
// and TANDEM_CPU_PREFETCH_BATCH1=0|1 override them (for measuring other machines); another value
// is named in `error` (CpuBackend::Create refuses it) and the default kept.
struct PrefetchPlan {
  int64_t bytes;      // distance ahead of the loads; 0: none (the quantized kernels' at the load)
  bool batch1;        // whether one activation row's 16-bit kernel prefetches too
  bool overridden;    // whether the environment set either
  std::string error;  // an environment value refused, or empty
};
PrefetchPlan ComputePrefetch();  // reads the CPU and the environment: call Prefetch()
// Inline, because the kernels ask for it once a block of rows (a call into another file was 1.4%
// of a 5-row quantized step).
inline const PrefetchPlan& Prefetch() {
  static const PrefetchPlan plan = ComputePrefetch();
  return plan;
}
// Whether the CPU says it is Intel's (cpuid's vendor string).
bool IsIntelCpu();
// The runs a batch-1 kernel reads side by side (DotRowsStreamed, QuantDotRowsStreamed,
// QuantDotRowsStreamedA8): four sequential streams, which read at the memory's rate on the machines
// measured (eight were 15-20% slower for int4 weights).
inline constexpr int kBatch1Streams = 4;
// out[i] = silu(gate[i]) · up[i] = gate[i] / (1 + exp(-gate[i])) · up[i] for i < n. With AVX-512 or
// AVX2 in vector lanes (the tail masked or padded, so an element's bits do not depend on where a
// call's range starts or ends): exp(-|g|) within 2 ulp (simd.h), then g / (1 + e) for g >= 0 and
// g·e / (1 + e) for g < 0 (the same function, its exp's argument never positive). Portable: the
// first form with std::exp.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);
// Converts n elements of type `dtype` to f32.
void ToF32(const void* src, DType dtype, float* dst, int64_t n);
// True when the AVX2/FMA/F16C paths are in use.
bool HaveAvx2();
// True when the AVX-512F dot products are in use (off with TANDEM_DISABLE_AVX512).
bool HaveAvx512();

}  // namespace tandem::cpu
