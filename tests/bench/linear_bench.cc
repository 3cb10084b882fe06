// Google Benchmark micro-benchmark of the CPU backend's Linear op (the GEMM/GEMV that dominates the
// forward pass) over weight dtypes and batch sizes, on a Qwen2.5-0.5B MLP shape [4864][896].
// Reports weight bytes/s (what batch-1 decode is bound by) and FLOP/s.
//   build/tests/bench/linear_bench [--benchmark_filter=BF16]
#include <random>

#include "benchmark/benchmark.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cpu/openblas_setup.h"
#include "common/quant/rtn.h"

namespace tandem {
namespace {

constexpr int64_t kRows = 4864, kCols = 896;

void BM_Linear(benchmark::State& state, DType dtype, bool batch_invariant = true,
               ActivationDType activations = ActivationDType::kF32) {
  const int64_t n = state.range(0);
  // Optional shape arguments (the padded kjv-target's MLP: [16384][256] and [256][16384]).
  const int64_t kRows = state.range(1) > 0 ? state.range(1) : tandem::kRows;
  const int64_t kCols = state.range(2) > 0 ? state.range(2) : tandem::kCols;
  CpuBackend::Options options;
  options.batch_invariant = batch_invariant;
  options.activations = activations;
  auto backend = CpuBackend::Create(options).value();
  std::mt19937 rng(1);
  std::vector<uint16_t> w16(kRows * kCols);
  std::vector<float> w32(kRows * kCols), x(n * kCols), out(n * kRows);
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    w32[i] = (rng() % 2001) * 1e-3f - 1.0f;
    w16[i] = dtype == DType::kF16 ? F32ToF16(w32[i]) : F32ToBf16(w32[i]);
  }
  for (auto& v : x) v = (rng() % 2001) * 1e-3f - 1.0f;
  DeviceWeight w{dtype, kRows, kCols,
                 dtype == DType::kF32 ? static_cast<const void*>(w32.data()) : w16.data(), nullptr};
  for (auto _ : state) {
    backend->Linear(x.data(), n, w, nullptr, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes = static_cast<double>(kRows * kCols * DTypeSize(dtype));
  state.counters["weight_GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * kRows * kCols * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_CAPTURE(BM_Linear, F32, DType::kF32)->ArgsProduct({{1, 8, 64}, {0}, {0}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Linear, F16, DType::kF16)->ArgsProduct({{1, 8, 64}, {0}, {0}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Linear, BF16, DType::kBF16)
    ->ArgsProduct({{1, 2, 3, 4, 5, 6, 8, 9, 16, 64}, {0}, {0}})
    ->UseRealTime();
// Prefill: the batch-invariant dot-product tiles against OpenBLAS SGEMM over converted tiles
// (--batch-invariant=false), on the Qwen2.5-0.5B MLP shape and kjv-target's [768][256].
BENCHMARK_CAPTURE(BM_Linear, BF16_prefill, DType::kBF16)
    ->ArgsProduct({{64, 512}, {0, 768}, {0, 256}})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Linear, BF16_prefill_openblas, DType::kBF16, false)
    ->ArgsProduct({{64, 512}, {0, 768}, {0, 256}})
    ->UseRealTime();
// --activation-dtype bf16 (vdpbf16ps), decode and prefill batches, cache- and DRAM-resident.
BENCHMARK_CAPTURE(BM_Linear, BF16_act_bf16, DType::kBF16, true, ActivationDType::kBF16)
    ->ArgsProduct({{1, 8, 64, 512}, {0}, {0}})
    ->Args({1, 16384, 8192})
    ->Args({8, 16384, 8192})
    ->UseRealTime();
// Speculative decoding's verification steps (1 + k rows) on shapes whose weights come from DRAM.
BENCHMARK_CAPTURE(BM_Linear, BF16_wide, DType::kBF16)
    ->ArgsProduct({{1, 2, 3, 4, 5, 8}, {16384}, {256}})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Linear, BF16_deep, DType::kBF16)
    ->ArgsProduct({{1, 2, 3, 4, 5, 8}, {256}, {16384}})
    ->UseRealTime();

// Weight-only INT8 (per channel) / INT4 (groups of 128) with --quantization's RTN defaults; the
// weight_GB/s counter counts the bytes a BF16 weight would have (the speed-up over BF16 at equal
// work), and quant_GB/s the bytes actually read. `a8`: with int8 activations (--activation-dtype).
void BM_LinearQuant(benchmark::State& state, QuantType type, bool a8 = false) {
  const int64_t n = state.range(0);
  const int64_t rows = state.range(1) > 0 ? state.range(1) : kRows;
  const int64_t cols = state.range(2) > 0 ? state.range(2) : kCols;
  CpuBackend::Options options;
  options.activations = a8 ? ActivationDType::kInt8 : ActivationDType::kF32;
  auto backend = CpuBackend::Create(options).value();
  std::mt19937 rng(1);
  std::vector<float> w32(rows * cols), x(n * cols), out(n * rows);
  for (auto& v : w32) v = (rng() % 2001) * 1e-3f - 1.0f;
  for (auto& v : x) v = (rng() % 2001) * 1e-3f - 1.0f;
  auto m = std::make_shared<QuantizedMatrix>(
      QuantizeRtn(w32.data(), rows, cols, DefaultRtnOptions(type)));
  const double quant_bytes = static_cast<double>(m->bytes());
  const DeviceWeight w = backend->UploadQuantizedWeight(m).value();
  for (auto _ : state) {
    backend->Linear(x.data(), n, w, nullptr, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["weight_GB/s"] = benchmark::Counter(static_cast<double>(rows * cols * 2) * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.counters["quant_GB/s"] =
      benchmark::Counter(quant_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_CAPTURE(BM_LinearQuant, INT8, QuantType::kInt8)
    ->ArgsProduct({{1, 5, 8, 64}, {0}, {0}})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearQuant, INT4, QuantType::kInt4)
    ->ArgsProduct({{1, 5, 8, 64}, {0}, {0}})
    ->UseRealTime();
// Weights far larger than the caches (BF16 256 MiB): what batch-1 decode of a real model reads.
// Batch 1 at the Qwen2.5-0.5B row lengths too: 896 (q, k, v, o, gate, up and the LM head) and
// 4864 (down), both read as four runs a thread side by side (cpu::DotRowsStreamed,
// cpu::QuantDotRowsStreamed).
BENCHMARK_CAPTURE(BM_Linear, BF16_dram, DType::kBF16)
    ->ArgsProduct({{1, 5}, {16384}, {8192}})
    ->Args({1, 524288, 256})
    ->Args({1, 151936, 896})
    ->Args({1, 27648, 4864})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearQuant, INT8_dram, QuantType::kInt8)
    ->ArgsProduct({{1, 5}, {16384}, {8192}})
    ->Args({1, 524288, 256})
    ->Args({1, 151936, 896})
    ->Args({1, 27648, 4864})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearQuant, INT4_dram, QuantType::kInt4)
    ->ArgsProduct({{1, 5}, {16384}, {8192}})
    ->Args({1, 524288, 256})
    ->Args({1, 151936, 896})
    ->Args({1, 27648, 4864})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearQuant, INT8_A8_dram, QuantType::kInt8, true)
    ->ArgsProduct({{1, 5}, {16384}, {8192}})
    ->Args({1, 151936, 896})
    ->Args({1, 27648, 4864})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearQuant, INT4_A8_dram, QuantType::kInt4, true)
    ->ArgsProduct({{1, 5}, {16384}, {8192}})
    ->Args({1, 151936, 896})
    ->Args({1, 27648, 4864})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearQuant, INT8_wide, QuantType::kInt8)
    ->ArgsProduct({{1, 5}, {16384}, {256}})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearQuant, INT4_wide, QuantType::kInt4)
    ->ArgsProduct({{1, 5}, {16384}, {256}})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearQuant, INT8_deep, QuantType::kInt8)
    ->ArgsProduct({{1, 5}, {256}, {16384}})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearQuant, INT4_deep, QuantType::kInt4)
    ->ArgsProduct({{1, 5}, {256}, {16384}})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LinearQuant, INT4_A8_wide, QuantType::kInt4, true)
    ->ArgsProduct({{1, 5}, {16384}, {256}})
    ->UseRealTime();

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::MaybeReexecWithFasterOpenBlasCore(argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
