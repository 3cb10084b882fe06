// Google Benchmark micro-benchmark of the CPU backend's paged attention (cpu/attention.h): a prompt
// attending to itself (kjv-target's heads: 8 query, 4 KV, head_dim 32, 1,000 tokens;
// qwen2.5-0.5b's: 14, 2, 64, 512 tokens) and a decode step of 8 sequences over 1,024 cached tokens
// each. Reports GFLOP/s (4 · heads · head_dim per (query, key) pair: the scores and the weighted
// values) and, for decode, the KV cache bytes read per second.
//   build/tests/bench/attention_bench [--benchmark_filter=prefill]
#include <cmath>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/backend/cpu/cpu_backend.h"

namespace tandem {
namespace {

// state: heads, kv_heads, head_dim, sequences, new tokens per sequence, cached tokens before them.
void BM_Attention(benchmark::State& state, DType kv_dtype) {
  const int64_t heads = state.range(0), kv_heads = state.range(1), hd = state.range(2);
  const int64_t seqs = state.range(3), fresh = state.range(4), cached = state.range(5);
  const int64_t bs = 16, ctx = cached + fresh, blocks_per_seq = (ctx + bs - 1) / bs;
  KvCacheGeometry g{1, seqs * blocks_per_seq, bs, kv_heads, hd};
  g.dtype = kv_dtype;
  auto backend = CpuBackend::Create({}).value();
  std::vector<char> kc(g.bytes_per_layer()), vc(g.bytes_per_layer());
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  const int64_t n = seqs * fresh;
  std::vector<float> q(n * heads * hd), k(n * kv_heads * hd), v(n * kv_heads * hd),
      out(n * heads * hd);
  for (auto* vec : {&q, &k, &v})
    for (auto& e : *vec) e = dist(rng);
  // Cached positions hold random keys and values too (written once by a prefill below).
  std::vector<int32_t> seq_indptr = {0}, positions, ctx_lens, bptr = {0}, table, slots;
  for (int64_t s = 0; s < seqs; ++s) {
    for (int64_t b = 0; b < blocks_per_seq; ++b)
      table.push_back(static_cast<int32_t>(s * blocks_per_seq + b));
    bptr.push_back(static_cast<int32_t>(table.size()));
    for (int64_t t = cached; t < ctx; ++t) {
      positions.push_back(static_cast<int32_t>(t));
      slots.push_back(static_cast<int32_t>((s * blocks_per_seq + t / bs) * bs + t % bs));
    }
    seq_indptr.push_back(static_cast<int32_t>(positions.size()));
    ctx_lens.push_back(static_cast<int32_t>(ctx));
  }
  AttentionMetadata md{seqs,
                       n,
                       ctx,
                       seq_indptr.data(),
                       positions.data(),
                       ctx_lens.data(),
                       bptr.data(),
                       table.data(),
                       slots.data()};
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (auto _ : state) {
    backend->PagedAttention(q.data(), k.data(), v.data(), kc.data(), vc.data(), g, 0, md, heads,
                            scale, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  double pairs = 0;  // (query, key) pairs per call
  for (int64_t t = cached; t < ctx; ++t) pairs += static_cast<double>(t + 1);
  pairs *= static_cast<double>(seqs * heads);
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * pairs * hd * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["kv_GB/s"] =
      benchmark::Counter(2.0 * seqs * ctx * kv_heads * hd * g.bytes_per_element() * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_CAPTURE(BM_Attention, prefill_f32, DType::kF32)
    ->Args({8, 4, 32, 1, 1000, 0})
    ->Args({14, 2, 64, 1, 512, 0})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Attention, decode_f32, DType::kF32)
    ->Args({14, 2, 64, 8, 1, 1023})
    ->Args({8, 4, 32, 8, 1, 1023})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Attention, decode_bf16, DType::kBF16)
    ->Args({14, 2, 64, 8, 1, 1023})
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Attention, decode_int8, DType::kI8)
    ->Args({14, 2, 64, 8, 1, 1023})
    ->UseRealTime();

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
