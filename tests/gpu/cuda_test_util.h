// What the CUDA backend's tests share (cuda_*_test.cc: ops, attention, sampling, the forward pass):
// the fixture with a CUDA and a CPU backend, random inputs and an attention batch over a paged
// cache. The CPU backend is the reference. Exit code 77 (ctest: skipped, label "gpu") without a
// device.
//
// Tolerances: ops that round the same way (embedding, gather, add) must match exactly; f32
// arithmetic in another order (norm, rope, silu, SGEMM, attention) within 1e-4 of unit-scale
// values; GEMMs over 16-bit weights are compared against the CPU on the same 16-bit-rounded
// activations. The whole model in F32 agrees within 2e-3 on logits of magnitude ~10 and on every
// greedy choice; in BF16 (activations rounded for the tensor cores) within |Δp| ≤ 3e-2 and the same
// top-1 wherever the CPU's margin is clear (cuda_forward_test.cc says why).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cuda/cuda_backend.h"
#include "common/backend/kv_cache_storage.h"
#include "gtest/gtest.h"

namespace tandem::cuda_test {

// Built against the CUDA emulator (tests/support/cuda_emu, ctest emu.*): the same tests on the CPU,
// where the two costliest sweeps (prompt attention's configurations, the decode script's prompt
// lengths) take a sample that still reaches every kernel and every key split.
#ifdef TANDEM_CUDA_EMULATED
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// n normal samples of standard deviation `scale` from `seed`. The last few large draws are kept and
// copied out again (the same values: the attention sweeps ask for the same megabyte caches case
// after case, and drawing them was a tenth of the emulated tests' time).
inline std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.f) {
  struct Drawn {
    size_t n;
    uint32_t seed;
    float scale;
    std::vector<float> values;
  };
  static std::vector<Drawn> kept;  // the most recent last; tests run on one thread
  constexpr size_t kKeepFrom = 1 << 16, kKept = 8;
  for (auto it = kept.begin(); n >= kKeepFrom && it != kept.end(); ++it) {
    if (it->n == n && it->seed == seed && it->scale == scale) {
      std::rotate(it, it + 1, kept.end());
      return kept.back().values;
    }
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  if (n >= kKeepFrom) {
    if (kept.size() == kKept) kept.erase(kept.begin());
    kept.push_back({n, seed, scale, v});
  }
  return v;
}

// Max over i of |a - b| / (1 + |b|).
inline float MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]) / (1.f + std::fabs(b[i])));
  }
  return d;
}

// A mixed batch over a shuffled paged cache: a fresh prefill, decodes over 300- and 700-token
// contexts (two splits of the split-KV kernels), a chunk after a cached prefix, a short one.
struct AttentionCase {
  KvCacheGeometry g;
  int64_t hq = 8, layer = 1, n = 0, max_context = 0;
  std::vector<int32_t> seq_indptr{0}, positions, context_lens, block_indptr{0}, blocks, slots;
  std::vector<float> kc, vc, q, k, v;

  struct Seq {
    int64_t cached, fresh;
  };
  AttentionCase(int64_t hd, int64_t num_q_heads, int64_t num_kv_heads, const std::vector<Seq>& seqs)
      : hq(num_q_heads) {
    g.num_layers = 2;
    g.num_blocks = 128;
    g.block_size = 16;
    g.num_kv_heads = num_kv_heads;
    g.head_dim = hd;
    std::vector<int32_t> perm(g.num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<uint32_t>(hd)));
    size_t next_block = 0;
    for (const Seq& s : seqs) {
      const int64_t context = s.cached + s.fresh,
                    nblocks = (context + g.block_size - 1) / g.block_size;
      const size_t first = blocks.size();
      for (int64_t b = 0; b < nblocks; ++b) blocks.push_back(perm[next_block++]);
      for (int64_t i = 0; i < s.fresh; ++i) {
        const int64_t p = s.cached + i;
        positions.push_back(static_cast<int32_t>(p));
        slots.push_back(static_cast<int32_t>(blocks[first + p / g.block_size] * g.block_size +
                                             p % g.block_size));
      }
      seq_indptr.push_back(seq_indptr.back() + static_cast<int32_t>(s.fresh));
      context_lens.push_back(static_cast<int32_t>(context));
      block_indptr.push_back(static_cast<int32_t>(blocks.size()));
      max_context = std::max(max_context, context);
    }
    n = seq_indptr.back();
    const size_t cache_elems = g.num_layers * g.elements_per_layer();
    kc = Random(cache_elems, 12);  // the cached prefixes
    vc = Random(cache_elems, 13);
    q = Random(n * hq * hd, 14);
    k = Random(n * g.num_kv_heads * hd, 15);
    v = Random(n * g.num_kv_heads * hd, 16);
  }
  AttentionMetadata Host() const {
    AttentionMetadata md;
    md.num_seqs = static_cast<int64_t>(context_lens.size());
    md.num_tokens = n;
    md.max_context_len = max_context;
    md.seq_indptr = seq_indptr.data();
    md.positions = positions.data();
    md.context_lens = context_lens.data();
    md.block_indptr = block_indptr.data();
    md.block_indices = blocks.data();
    md.slot_mapping = slots.data();
    return md;
  }
  float scale() const { return 1.f / std::sqrt(static_cast<float>(g.head_dim)); }
};

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The backend's kAuto is checked against the CUDA-core prompt kernel: not the tensor-core one.
    ::unsetenv("TANDEM_CUDA_TC_ATTENTION");
    cpu_ = CpuBackend::Create({}).value();
    auto cuda = CudaBackend::Create({});
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    gpu_ = std::move(cuda).value();
  }
  void TearDown() override {
    if (gpu_) {
      EXPECT_TRUE(gpu_->CheckErrors().ok()) << gpu_->CheckErrors();
    }
  }

  // A device copy of `host` (ints or floats), kept alive by the fixture.
  template <typename T>
  T* Up(const std::vector<T>& host) {
    auto buf = gpu_->Allocate(std::max<size_t>(host.size(), 1) * sizeof(T)).value();
    gpu_->CopyToDevice(buf->data(), host.data(), host.size() * sizeof(T));
    T* p = static_cast<T*>(buf->data());
    buffers_.push_back(std::move(buf));
    return p;
  }
  float* Zeros(size_t n) { return Up(std::vector<float>(n, 0.f)); }
  // The case's attention metadata with every array copied to the device.
  AttentionMetadata OnDevice(const AttentionCase& c) {
    AttentionMetadata md = c.Host();
    md.seq_indptr = Up(c.seq_indptr);
    md.positions = Up(c.positions);
    md.context_lens = Up(c.context_lens);
    md.block_indptr = Up(c.block_indptr);
    md.block_indices = Up(c.blocks);
    md.slot_mapping = Up(c.slots);
    return md;
  }
  std::vector<float> Down(const float* dev, size_t n) {
    std::vector<float> host(n);
    gpu_->CopyToHost(host.data(), dev, n * sizeof(float));
    return host;
  }
  // A checkpoint tensor [rows][cols] (a vector when rows == 1) of `f32` stored as `dtype` (values
  // rounded to it); its bytes live as long as the fixture, as the CPU backend maps 2-D weights in
  // place.
  TensorView View(const std::vector<float>& f32, int64_t rows, int64_t cols, DType dtype) {
    auto bytes = std::make_shared<std::vector<uint16_t>>();
    TensorView t;
    t.name = "w";
    t.dtype = dtype;
    t.shape = rows == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{rows, cols};
    if (dtype == DType::kF32) {
      t.data = reinterpret_cast<const std::byte*>(f32.data());
      t.nbytes = f32.size() * 4;
    } else {
      for (float x : f32) bytes->push_back(dtype == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x));
      t.data = reinterpret_cast<const std::byte*>(bytes->data());
      t.nbytes = bytes->size() * 2;
      host_bytes_.push_back(bytes);
    }
    return t;
  }
  // Both backends' copies of that weight.
  std::pair<DeviceWeight, DeviceWeight> Weights(const std::vector<float>& f32, int64_t rows,
                                                int64_t cols, DType dtype) {
    const TensorView t = View(f32, rows, cols, dtype);
    return {cpu_->UploadWeight(t).value(), gpu_->UploadWeight(t).value()};
  }

  std::unique_ptr<CpuBackend> cpu_;
  std::unique_ptr<CudaBackend> gpu_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  std::vector<std::shared_ptr<std::vector<uint16_t>>> host_bytes_;
};

}  // namespace tandem::cuda_test
