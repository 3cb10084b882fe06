// Google Benchmark micro-benchmark of the CPU backend's elementwise ops on Qwen2.5-0.5B's MLP width
// (4,864): SiLU · up for a decode row and a 512-token prompt, through the backend (the thread pool)
// and as one kernel call (cpu::SiluMul's vector lanes), beside the scalar formula with the C
// library's expf that the vector kernel replaced, in the same run. Reports elements/s and the bytes
// moved per second (two f32 inputs, one output).
//   build/tests/bench/elementwise_bench [--benchmark_filter=Silu]
#include <cmath>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cpu/cpu_kernels.h"

namespace tandem {
namespace {

constexpr int64_t kWidth = 4864;

struct Inputs {
  std::vector<float> gate, up, out;
  explicit Inputs(int64_t n) : gate(n), up(n), out(n) {
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.f, 2.f);
    for (int64_t i = 0; i < n; ++i) gate[i] = dist(rng), up[i] = dist(rng);
  }
};

void Counters(benchmark::State& state, int64_t n) {
  state.counters["elements/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] = benchmark::Counter(12.0 * static_cast<double>(n) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

// state: rows of kWidth.
void BM_SiluMulBackend(benchmark::State& state) {
  const int64_t rows = state.range(0), n = rows * kWidth;
  auto backend = CpuBackend::Create({}).value();
  Inputs in(n);
  for (auto _ : state) {
    backend->SiluMul(in.gate.data(), in.up.data(), rows, kWidth, in.out.data());
    benchmark::DoNotOptimize(in.out.data());
  }
  Counters(state, n);
}

void BM_SiluMulKernel(benchmark::State& state) {
  const int64_t n = state.range(0) * kWidth;
  Inputs in(n);
  for (auto _ : state) {
    cpu::SiluMul(in.gate.data(), in.up.data(), n, in.out.data());
    benchmark::DoNotOptimize(in.out.data());
  }
  Counters(state, n);
}

// The scalar loop with std::exp (what the backend ran before cpu::SiluMul), one thread.
void BM_SiluMulScalarExpf(benchmark::State& state) {
  const int64_t n = state.range(0) * kWidth;
  Inputs in(n);
  for (auto _ : state) {
    for (int64_t i = 0; i < n; ++i)
      in.out[i] = in.gate[i] / (1.0f + std::exp(-in.gate[i])) * in.up[i];
    benchmark::DoNotOptimize(in.out.data());
  }
  Counters(state, n);
}

BENCHMARK(BM_SiluMulBackend)->Arg(1)->Arg(512)->UseRealTime();
BENCHMARK(BM_SiluMulKernel)->Arg(1)->Arg(512)->UseRealTime();
BENCHMARK(BM_SiluMulScalarExpf)->Arg(1)->Arg(512)->UseRealTime();

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
