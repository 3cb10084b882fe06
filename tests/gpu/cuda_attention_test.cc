// The CUDA backend's attention against the CPU backend: paged decode attention (in-block and
// split-KV, every mode bit for bit), the q|k|v prologue, 16-bit caches and the tiled and
// tensor-core prompt kernels (tolerances: cuda_test_util.h).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cuda/cuda_backend.h"
#ifdef TANDEM_CUDA_EMULATED
#include "tests/support/cuda_emu/counters.h"
#endif
#include "common/backend/cuda/gemv.h"
#include "common/backend/cuda/kernels.h"
#include "common/backend/cuda/paged_attention.h"
#include "common/backend/cuda/prefill_attention.h"
#include "common/backend/cuda/smoke_kernel.h"
#include "common/backend/kv_cache_storage.h"
#include "common/base/argmax.h"
#include "common/engine/engine.h"
#include "common/model/llama_model.h"
#include "common/quant/rtn.h"
#include "common/sampling/device_sampling.h"
#include "common/sampling/sampler.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/unit/tiny_models.h"

namespace tandem::cuda_test {
namespace {
const std::vector<AttentionCase::Seq> kMixedBatch = {
    {0, 37}, {300, 1}, {150, 20}, {700, 1}, {5, 3}};

TEST_F(CudaBackendTest, PagedAttentionMatches) {
  // head_dim 80 takes the one-block-per-head kernel; the others the split-KV ones, with one head
  // chunk (8 and 7 query heads per KV head) or two (16 per KV head at head_dim 256).
  for (int64_t hd : {32, 64, 80, 128, 256}) {
    for (auto [hq, kvh] : std::vector<std::pair<int64_t, int64_t>>{{8, 2}, {16, 2}, {7, 1}}) {
      AttentionCase c(hd, hq, kvh, kMixedBatch);
      const size_t cache_elems = c.g.num_layers * c.g.elements_per_layer();
      float *kcg = Up(c.kc), *vcg = Up(c.vc), *out = Zeros(c.n * hq * hd);
      const AttentionMetadata md = OnDevice(c);
      gpu_->PagedAttention(Up(c.q), Up(c.k), Up(c.v), kcg, vcg, c.g, c.layer, md, hq, c.scale(),
                           out);
      std::vector<float> ref(c.n * hq * hd), kc = c.kc, vc = c.vc;
      cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), kc.data(), vc.data(), c.g, c.layer,
                           c.Host(), hq, c.scale(), ref.data());
      EXPECT_LE(MaxRelDiff(Down(out, ref.size()), ref), 1e-4f)
          << "head_dim " << hd << ", heads " << hq << "/" << kvh;
      EXPECT_EQ(Down(kcg, cache_elems), kc) << "K cache writes, head_dim " << hd;
      EXPECT_EQ(Down(vcg, cache_elems), vc) << "V cache writes, head_dim " << hd;
    }
  }
}

// One q|k|v attention over caches that start as `cache_init`: fused (QkvAttention: the GEMV or
// prologue kernel) or composed (the projection, then AttendProjectedQkv's ops); `in` holds the
// projection's input, weights and norms, this fills its qkv (from `qkv`), q, k, v and RoPE buffers.
// Its output, both caches, and (on the emulator) the kernels it ran.
struct QkvRun {
  std::vector<float> out;
  std::vector<std::byte> kc, vc;
  uint64_t kernels = 0;
};

class QkvAttentionTest : public CudaBackendTest {
 protected:
  QkvRun RunQkv(QkvAttentionInput in, const std::vector<float>& qkv, const AttentionCase& c,
                const AttentionMetadata& md, const std::vector<float>& inv_freq,
                const std::vector<std::byte>& cache_init, bool fused) {
    const int64_t hq = c.hq, hk = c.g.num_kv_heads, hd = c.g.head_dim;
    in.qkv = Up(qkv);  // (the composed ops normalise q and k in place)
    in.inv_freq = Up(inv_freq);
    in.q = Zeros(c.n * hq * hd);
    in.k = Zeros(c.n * hk * hd);
    in.v = Zeros(c.n * hk * hd);
    float* out = Zeros(c.n * hq * hd);
    void *kc = Up(cache_init), *vc = Up(cache_init);
    QkvRun r;
#ifdef TANDEM_CUDA_EMULATED
    const uint64_t before = tandem_emu::KernelsRun();
#endif
    if (fused) {
      gpu_->QkvAttention(in, kc, vc, c.g, c.layer, md, hq, c.scale(), out);
    } else {
      gpu_->ProjectQkv(in, c.n);
      AttendProjectedQkv(*gpu_, in, kc, vc, c.g, c.layer, md, hq, c.scale(), out);
    }
#ifdef TANDEM_CUDA_EMULATED
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // (deferred streams run at a sync)
    r.kernels = tandem_emu::KernelsRun() - before;
#endif
    r.out = Down(out, c.n * hq * hd);
    r.kc.resize(cache_init.size());
    r.vc.resize(cache_init.size());
    gpu_->CopyToHost(r.kc.data(), kc, cache_init.size());
    gpu_->CopyToHost(r.vc.data(), vc, cache_init.size());
    return r;
  }
};

// Over quantized q|k|v weights (int4, the norm and a bias in the projection), the quantized GEMV
// runs the prologue too: the bits of the projection followed by the ops the prologue replaces,
// over BF16 and FP8 caches, one and eight tokens, with 2 columns a warp (a 6144-row q|k|v); on the
// emulator, one kernel fewer.
TEST_F(QkvAttentionTest, QuantizedQkvGemvRunsThePrologue) {
  const int64_t hd = 128, hq = 44, hk = 2, kin = 64, row = (hq + 2 * hk) * hd;
  const std::vector<float> wf = Random(row * kin, 71, 0.05f), bias = Random(row, 72),
                           xn = Random(kin, 73);
  RtnOptions o;
  o.type = QuantType::kInt4;
  o.group_size = 64;
  o.symmetric = false;
  const DeviceWeight ww = gpu_->UploadQuantizedWeight(std::make_shared<QuantizedMatrix>(
                                                          QuantizeRtn(wf.data(), row, kin, o)))
                              .value();
  const DeviceWeight bw = gpu_->UploadWeight(View(bias, 1, row, DType::kF32)).value();
  const DeviceWeight nw = gpu_->UploadWeight(View(xn, 1, kin, DType::kF32)).value();
  std::vector<float> inv(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i)
    inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / hd));
  for (DType dt : {DType::kBF16, DType::kF8E4M3}) {
    for (bool single : {true, false}) {
      AttentionCase c(
          hd, hq, hk,
          single ? std::vector<AttentionCase::Seq>{{30, 1}}
                 : std::vector<AttentionCase::Seq>{{30, 1}, {10, 1}, {40, 2}, {7, 1}, {5, 3}});
      c.g.dtype = dt;
      const std::vector<float> x = Random(c.n * kin, 74);
      const size_t cache_bytes = c.g.num_layers * c.g.elements_per_layer() * DTypeSize(dt);
      std::vector<std::byte> cache_init(cache_bytes);
      for (size_t i = 0; i < cache_bytes; ++i) cache_init[i] = static_cast<std::byte>(i * 7 % 61);
      const AttentionMetadata md = OnDevice(c);
      QkvAttentionInput in;
      in.x = Up(x);
      in.w = &ww;
      in.bias = &bw;
      in.norm = &nw;
      in.h = Zeros(c.n * kin);
      in.scratch = Zeros(c.n * row);
      in.eps = 1e-6f;
      const std::vector<float> qkv(c.n * row, 0.f);
      const QkvRun a = RunQkv(in, qkv, c, md, inv, cache_init, false),
                   b = RunQkv(in, qkv, c, md, inv, cache_init, true);
      const std::string what =
          absl::StrCat(std::string(DTypeName(dt)), single ? " one token" : " eight tokens");
      EXPECT_EQ(b.out, a.out) << what;
      EXPECT_TRUE(b.kc == a.kc) << "K cache, " << what;
      EXPECT_TRUE(b.vc == a.vc) << "V cache, " << what;
      EXPECT_FALSE(a.kc == cache_init) << "keys written, " << what;
      if (kEmulated) EXPECT_LT(b.kernels, a.kernels) << what;
    }
  }
  EXPECT_TRUE(gpu_->CheckErrors().ok());
}

// The q|k|v prologue kernel (split, q/k norms, RoPE, cache write in one pass): the bits of the ops
// it replaces (AttendProjectedQkv: CopyColumns, RmsNorm, Rope, PagedAttention), output and
// both caches, over the mixed batch with a padding token (slot -1) and over a single token, with
// and without Qwen3's norms, over f32, BF16 and FP8 caches; and within rounding of the CPU. With
// the projection in its input (proj 1: Linear, 2: RmsNormLinear with a bias), over BF16 weights:
// on a BF16 or FP8 cache and up to 8 tokens the q|k|v GEMV's last blocks run the prologue (their
// counters reused case after case), elsewhere the projection then the prologue kernel; the same
// bits as the projection op followed by the ops the prologue replaces.
TEST_F(QkvAttentionTest, QkvPrologueGivesTheBitsOfTheOpsItReplaces) {
  const std::vector<AttentionCase::Seq> kEightTokens = {
      {300, 1}, {10, 1}, {40, 2}, {700, 1}, {5, 3}};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
    for (int64_t hd : {64, 80, 128}) {
      for (int batch : {0, 1, 2}) {  // the mixed batch, one token, eight tokens
        for (int proj : {0, 1, 2}) {
          for (bool norms : {false, true}) {
            if (batch == 0 && proj == 2) continue;  // cuBLAS: no norm prologue
            // FP8 (whose prologue the q|k|v GEMV also runs) at one head size; the other head sizes
            // (another thread layout of the same prologue) with the q/k norms, every other choice
            // at head_dim 128.
            if (dt == DType::kF8E4M3 && (hd != 128 || batch == 0)) continue;
            if (hd != 128 && !norms) continue;
            const bool single = batch == 1;
            const int64_t hq = 8, hk = 2;
            AttentionCase c(hd, hq, hk,
                            single       ? std::vector<AttentionCase::Seq>{{300, 1}}
                            : batch == 0 ? kMixedBatch
                                         : kEightTokens);
            c.g.dtype = dt;
            if (!single) c.slots[3] = -1;  // a padding token: rotated, not stored
            const int64_t row = (hq + 2 * hk) * hd, kin = 64;
            const std::vector<float> qkv = Random(c.n * row, 61), qn = Random(hd, 62),
                                     kn = Random(hd, 63);
            const std::vector<float> x = Random(c.n * kin, 64), wf = Random(row * kin, 65),
                                     bias = Random(row, 66), xn = Random(kin, 67);
            const DeviceWeight ww = gpu_->UploadWeight(View(wf, row, kin, DType::kBF16)).value();
            const DeviceWeight bw = gpu_->UploadWeight(View(bias, 1, row, DType::kF32)).value();
            const DeviceWeight nw = gpu_->UploadWeight(View(xn, 1, kin, DType::kF32)).value();
            std::vector<float> inv(hd / 2);
            for (int64_t i = 0; i < hd / 2; ++i)
              inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / hd));
            const DeviceWeight qw = gpu_->UploadWeight(View(qn, 1, hd, DType::kF32)).value();
            const DeviceWeight kw = gpu_->UploadWeight(View(kn, 1, hd, DType::kF32)).value();
            const size_t elems = c.g.num_layers * c.g.elements_per_layer(),
                         cache_bytes = elems * DTypeSize(dt);
            std::vector<std::byte> cache_init(cache_bytes);
            for (size_t i = 0; i < cache_bytes; ++i)
              cache_init[i] = static_cast<std::byte>(i * 7 % 61);
            const AttentionMetadata md = OnDevice(c);
            QkvAttentionInput in;
            if (proj > 0) {
              in.x = Up(x);
              in.w = &ww;
              in.bias = proj == 2 ? &bw : nullptr;
              in.norm = proj == 2 ? &nw : nullptr;
              in.h = Zeros(c.n * kin);
              in.scratch = Zeros(c.n * row);
            }
            if (norms) {
              in.q_norm = &qw;
              in.k_norm = &kw;
            }
            in.eps = 1e-6f;
            const QkvRun a = RunQkv(in, qkv, c, md, inv, cache_init, false),
                         b = RunQkv(in, qkv, c, md, inv, cache_init, true);
            const std::string what =
                absl::StrCat(std::string(DTypeName(dt)), " head_dim ", hd,
                             batch == 1   ? " one token"
                             : batch == 2 ? " eight tokens"
                                          : "",
                             norms ? " with q/k norms" : "", proj == 1 ? ", projected" : "",
                             proj == 2 ? ", normalised, projected with a bias" : "");
            EXPECT_EQ(b.out, a.out) << what;
            EXPECT_TRUE(b.kc == a.kc) << "K cache, " << what;
            EXPECT_TRUE(b.vc == a.vc) << "V cache, " << what;
            EXPECT_FALSE(a.kc == cache_init) << "keys written, " << what;
            // The CPU's own ops (an f32 cache: the CPU's 16-bit cache is checked elsewhere).
            if (dt != DType::kF32 || proj > 0) continue;
            const DeviceWeight qc = cpu_->UploadWeight(View(qn, 1, hd, DType::kF32)).value();
            const DeviceWeight kcw = cpu_->UploadWeight(View(kn, 1, hd, DType::kF32)).value();
            std::vector<float> qkv_c = qkv, qb(c.n * hq * hd), kb(c.n * hk * hd), vb(c.n * hk * hd),
                               ref(c.n * hq * hd);
            std::vector<float> kc_c(elems), vc_c(elems);
            std::memcpy(kc_c.data(), cache_init.data(), cache_bytes);
            std::memcpy(vc_c.data(), cache_init.data(), cache_bytes);
            QkvAttentionInput on_cpu;
            on_cpu.qkv = qkv_c.data();
            if (norms) {
              on_cpu.q_norm = &qc;
              on_cpu.k_norm = &kcw;
            }
            on_cpu.eps = 1e-6f;
            on_cpu.inv_freq = inv.data();
            on_cpu.q = qb.data();
            on_cpu.k = kb.data();
            on_cpu.v = vb.data();
            ComposedQkvAttention(*cpu_, on_cpu, kc_c.data(), vc_c.data(), c.g, c.layer, c.Host(),
                                 hq, c.scale(), ref.data());
            EXPECT_LE(MaxRelDiff(b.out, ref), 1e-4f) << what;
          }
        }
      }
    }
  }
  cuda::QkvPrologueArgs bad;
  bad.num_tokens = 1;
  bad.num_q_heads = 8;
  bad.layer.num_kv_heads = 2;
  bad.layer.head_dim = cuda::kMaxPrologueHeadDim + 2;
  EXPECT_EQ(cuda::LaunchQkvPrologue(bad, nullptr), cudaErrorInvalidValue);
  bad.layer.head_dim = 63;
  EXPECT_EQ(cuda::LaunchQkvPrologue(bad, nullptr), cudaErrorInvalidValue);
}

// Every attention kernel writes its output rounded for the o projection's GEMM too (RoundOutput): a
// step of prompt chunks (the tiled kernel, or with TANDEM_CUDA_TC_ATTENTION its tensor-core twin,
// with the split-KV kernel for the decode token beside them) then the GEMM: the bits of a GEMM over
// a fresh copy of the output.
TEST_F(CudaBackendTest, AttentionWritesTheOProjectionsInputRounded) {
  for (bool tc : {false, true}) {
    if (tc) ::setenv("TANDEM_CUDA_TC_ATTENTION", "1", 1);
    auto backend = CudaBackend::Create({});
    ::unsetenv("TANDEM_CUDA_TC_ATTENTION");
    ASSERT_TRUE(backend.ok()) << backend.status();
    CudaBackend* b = backend->get();
    AttentionCase c(64, 8, 2, {{0, 80}, {300, 1}, {40, 70}});
    c.g.dtype = DType::kBF16;
    const int64_t d = c.hq * 64, m = 96;
    const DeviceWeight w =
        b->UploadWeight(View(Random(m * d, 81, 0.05f), m, d, DType::kBF16)).value();
    // Buffers from the fixture's backend (one device, uploads finished on return); b reads them
    // back on its own stream, after its work.
    std::vector<uint16_t> cache(c.g.num_layers * c.g.elements_per_layer());
    for (size_t i = 0; i < cache.size(); ++i) cache[i] = F32ToBf16(c.kc[i]);
    float *attn = Zeros(c.n * d), *out = Zeros(c.n * m);
    b->PagedAttention(Up(c.q), Up(c.k), Up(c.v), Up(cache), Up(cache), c.g, c.layer, OnDevice(c),
                      c.hq, c.scale(), attn);
    b->Linear(attn, c.n, w, nullptr, out);
    std::vector<float> got(c.n * m), a(c.n * d), ref(c.n * m);
    b->CopyToHost(got.data(), out, got.size() * 4);
    b->CopyToHost(a.data(), attn, a.size() * 4);
    b->Linear(Up(a), c.n, w, nullptr, out);
    b->CopyToHost(ref.data(), out, ref.size() * 4);
    EXPECT_EQ(got, ref) << (tc ? "tensor-core" : "tiled") << " prompt kernel";
    EXPECT_TRUE(b->CheckErrors().ok());
  }
}

// A BF16 or F16 cache: keys and values written rounded to nearest even, exactly as the CPU rounds
// them, and attention over them within f32 rounding of the CPU's.
TEST_F(CudaBackendTest, PagedAttentionOverA16BitCacheMatchesTheCpu) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int64_t hd : {64, 80, 128}) {
      AttentionCase c(hd, 8, 2, kMixedBatch);
      c.g.dtype = dt;
      const size_t cache_elems = c.g.num_layers * c.g.elements_per_layer();
      std::vector<uint16_t> kc(cache_elems), vc(cache_elems);
      for (size_t i = 0; i < cache_elems; ++i) {
        kc[i] = dt == DType::kBF16 ? F32ToBf16(c.kc[i]) : F32ToF16(c.kc[i]);
        vc[i] = dt == DType::kBF16 ? F32ToBf16(c.vc[i]) : F32ToF16(c.vc[i]);
      }
      uint16_t *kcg = Up(kc), *vcg = Up(vc);
      float* out = Zeros(c.n * c.hq * hd);
      gpu_->PagedAttention(Up(c.q), Up(c.k), Up(c.v), kcg, vcg, c.g, c.layer, OnDevice(c), c.hq,
                           c.scale(), out);
      std::vector<float> ref(c.n * c.hq * hd);
      cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), kc.data(), vc.data(), c.g, c.layer,
                           c.Host(), c.hq, c.scale(), ref.data());
      EXPECT_LE(MaxRelDiff(Down(out, ref.size()), ref), 1e-4f)
          << DTypeName(dt) << " head_dim " << hd;
      std::vector<uint16_t> k_back(cache_elems), v_back(cache_elems);
      gpu_->CopyToHost(k_back.data(), kcg, cache_elems * 2);
      gpu_->CopyToHost(v_back.data(), vcg, cache_elems * 2);
      EXPECT_EQ(k_back, kc) << "K cache writes, " << DTypeName(dt) << " head_dim " << hd;
      EXPECT_EQ(v_back, vc) << "V cache writes, " << DTypeName(dt) << " head_dim " << hd;
    }
  }
}

// FP8 E4M3 from the format's definition (OCP 8-bit floating point: bias 7, 3 mantissa bits, no
// infinities, largest finite 448): code c's value, and the nearest finite code to x (ties to the
// even code), which saturates at ±448 as the cache's writes do.
float E4M3Value(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const float mag = e == 0 ? std::ldexp(m / 8.f, -6) : std::ldexp(1.f + m / 8.f, e - 7);
  return (c & 0x80) != 0 ? -mag : mag;
}
uint8_t E4M3(float x) {
  // The non-negative finite codes 0..0x7e increase with their values (0x7f is NaN).
  static const std::vector<float> values = [] {
    std::vector<float> v;
    for (int c = 0; c <= 0x7e; ++c) v.push_back(E4M3Value(static_cast<uint8_t>(c)));
    return v;
  }();
  const float a = std::fabs(x);
  const int hi =
      static_cast<int>(std::lower_bound(values.begin(), values.end(), a) - values.begin());
  int best = std::min(hi, 0x7e);  // past 448: saturates
  if (hi > 0 && hi <= 0x7e) {
    const float below = a - values[hi - 1], above = values[hi] - a;
    if (below < above || (below == above && (hi - 1) % 2 == 0)) best = hi - 1;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));  // -0 keeps its sign
}

// An FP8 E4M3 cache (CUDA's --kv-cache-dtype fp8): new keys and values written rounded to nearest
// even and saturated (the bytes against the encoder above), and attention over the cache within f32
// rounding of the CPU's over an f32 cache holding the same values.
TEST_F(CudaBackendTest, PagedAttentionOverAnFp8CacheMatchesTheCpuOnItsValues) {
  ASSERT_TRUE(gpu_->SupportsKvCacheDType(DType::kF8E4M3));
  ASSERT_FALSE(cpu_->SupportsKvCacheDType(DType::kF8E4M3));
  for (int64_t hd : {32, 80, 128}) {  // 1-byte rows a lane; the per-token kernel; 4-byte
    AttentionCase c(hd, 8, 2, kMixedBatch);
    c.k[0] = 1000.f;  // beyond ±448: saturates
    c.v[1] = -600.f;
    const size_t cache_elems = c.g.num_layers * c.g.elements_per_layer();
    std::vector<uint8_t> kc(cache_elems), vc(cache_elems);
    std::vector<float> kf(cache_elems), vf(cache_elems);
    for (size_t i = 0; i < cache_elems; ++i) {
      kc[i] = E4M3(c.kc[i]), vc[i] = E4M3(c.vc[i]);
      kf[i] = E4M3Value(kc[i]), vf[i] = E4M3Value(vc[i]);
    }
    // What the writes must leave, and the new rows as the fp8 cache keeps them, for the CPU.
    std::vector<uint8_t> k_want = kc, v_want = vc;
    std::vector<float> k_kept(c.k.size()), v_kept(c.v.size());
    const int64_t row = c.g.num_kv_heads * hd, layer0 = c.layer * c.g.elements_per_layer();
    for (size_t t = 0; t < c.slots.size(); ++t) {
      for (int64_t j = 0; j < row; ++j) {
        const size_t at = layer0 + c.slots[t] * row + j, in = t * row + j;
        k_want[at] = E4M3(c.k[in]), v_want[at] = E4M3(c.v[in]);
        k_kept[in] = E4M3Value(k_want[at]), v_kept[in] = E4M3Value(v_want[at]);
      }
    }
    EXPECT_EQ(k_want[layer0 + c.slots[0] * row], 0x7e) << "1000 saturates to 448";
    EXPECT_EQ(v_want[layer0 + c.slots[0] * row + 1], 0xfe) << "-600 saturates to -448";
    KvCacheGeometry g8 = c.g;
    g8.dtype = DType::kF8E4M3;
    uint8_t *kg = Up(kc), *vg = Up(vc);
    float* out = Zeros(c.n * c.hq * hd);
    gpu_->PagedAttention(Up(c.q), Up(c.k), Up(c.v), kg, vg, g8, c.layer, OnDevice(c), c.hq,
                         c.scale(), out);
    std::vector<float> ref(c.n * c.hq * hd);
    cpu_->PagedAttention(c.q.data(), k_kept.data(), v_kept.data(), kf.data(), vf.data(), c.g,
                         c.layer, c.Host(), c.hq, c.scale(), ref.data());
    EXPECT_LE(MaxRelDiff(Down(out, ref.size()), ref), 1e-4f) << "head_dim " << hd;
    std::vector<uint8_t> k_back(cache_elems), v_back(cache_elems);
    gpu_->CopyToHost(k_back.data(), kg, cache_elems);
    gpu_->CopyToHost(v_back.data(), vg, cache_elems);
    EXPECT_EQ(k_back, k_want) << "K cache writes, head_dim " << hd;
    EXPECT_EQ(v_back, v_want) << "V cache writes, head_dim " << hd;
  }
}

// c's cached keys or values (`x`: c.kc or c.vc, f32 rows slot after slot) as an int8 cache holds
// them (KvCacheGeometry's I8 layout: a block's codes, then its scales): per slot and head a scale
// max|x| / 127 and codes round(x / scale).
std::vector<uint8_t> Int8Cache(const AttentionCase& c, const std::vector<float>& x) {
  KvCacheGeometry g = c.g;
  g.dtype = DType::kI8;
  std::vector<uint8_t> out(g.num_layers * g.bytes_per_layer());
  const int64_t hd = g.head_dim, kvh = g.num_kv_heads;
  for (int64_t l = 0; l < g.num_layers; ++l) {
    for (int64_t slot = 0; slot < g.num_blocks * g.block_size; ++slot) {
      uint8_t* layer = out.data() + l * g.bytes_per_layer();
      for (int64_t h = 0; h < kvh; ++h) {
        const float* src = x.data() + l * c.g.elements_per_layer() + (slot * kvh + h) * hd;
        float amax = 0;
        for (int64_t i = 0; i < hd; ++i) amax = std::max(amax, std::fabs(src[i]));
        const float scale = amax > 0 ? amax / 127.f : 1.f;
        std::memcpy(layer + g.scale_offset(slot) + h * 4, &scale, 4);
        for (int64_t i = 0; i < hd; ++i) {
          layer[g.slot_offset(slot) + h * hd + i] =
              static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(src[i] / scale)));
        }
      }
    }
  }
  return out;
}

// An int8 cache (a scale per token and head, the scales after each block's codes): in every mode of
// the kernels (split-KV in-block and grid split, the per-token kernel, the tiled prompt kernel) the
// GPU writes the CPU's bytes and attends within f32 rounding of the CPU over the same cache.
TEST_F(CudaBackendTest, PagedAttentionOverAnInt8CacheMatchesTheCpuInEveryMode) {
  ASSERT_TRUE(gpu_->SupportsKvCacheDType(DType::kI8));
  for (int64_t hd : {32, 80, 128, 256}) {
    AttentionCase c(hd, 8, 2, kMixedBatch);
    KvCacheGeometry g8 = c.g;
    g8.dtype = DType::kI8;
    const std::vector<uint8_t> kc = Int8Cache(c, c.kc), vc = Int8Cache(c, c.vc);
    std::vector<uint8_t> k_cpu = kc, v_cpu = vc;
    std::vector<float> ref(c.n * c.hq * hd);
    cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), k_cpu.data(), v_cpu.data(), g8,
                         c.layer, c.Host(), c.hq, c.scale(), ref.data());
    const AttentionMetadata md = OnDevice(c);
    std::vector<std::pair<std::string, cuda::AttentionMode>> modes = {
        {"auto", cuda::AttentionMode::kAuto},
        {"in-block", cuda::AttentionMode::kInBlock},
        {"grid-split", cuda::AttentionMode::kGridSplit},
        {"per-token", cuda::AttentionMode::kLegacy}};
    if (hd != 80) modes.push_back({"tiled", cuda::AttentionMode::kTiled});
    for (const auto& [name, mode] : modes) {
      if (hd == 80 && mode == cuda::AttentionMode::kGridSplit) continue;  // split-KV: 32..256
      uint8_t *kg = Up(kc), *vg = Up(vc);
      cuda::PagedAttentionArgs a = CudaBackend::AttentionArgs(
          Up(c.q), Up(c.k), Up(c.v), kg, vg, g8, c.layer, md, c.hq, c.scale(), nullptr);
      a.mode = mode;
      a.workspace_floats = cuda::SplitAttentionWorkspaceFloats(a);
      a.workspace = a.workspace_floats > 0 ? Zeros(a.workspace_floats) : nullptr;
      a.out = Zeros(c.n * c.hq * hd);
      ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess) << name << " " << hd;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_LE(MaxRelDiff(Down(a.out, ref.size()), ref), 1e-4f) << name << " head_dim " << hd;
      std::vector<uint8_t> k_back(kc.size()), v_back(vc.size());
      gpu_->CopyToHost(k_back.data(), kg, kc.size());
      gpu_->CopyToHost(v_back.data(), vg, vc.size());
      EXPECT_EQ(k_back, k_cpu) << "K cache writes, " << name << " head_dim " << hd;
      EXPECT_EQ(v_back, v_cpu) << "V cache writes, " << name << " head_dim " << hd;
    }
  }
}

// The tiled prompt kernel against the CPU: long prompt chunks over cached prefixes, tiles that span
// sequences, a decode token among them; a first tile of five runs with sequences of no new tokens
// between them; in f32, BF16 and F16 caches. The backend's own launch (kAuto, not batch-invariant)
// takes it for such a step's long sequences and the split-KV kernel for the short ones.
TEST_F(CudaBackendTest, TiledPrefillAttentionMatchesTheCpu) {
  const std::vector<std::vector<AttentionCase::Seq>> batches = {
      {{0, 150}, {40, 90}, {300, 70}, {700, 1}, {5, 3}},
      {{10, 5}, {0, 0}, {0, 7}, {260, 30}, {3, 9}, {40, 0}, {0, 40}}};
  int case_index = -1;
  for (const auto& prompts : batches)
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t hd : {32, 64, 128, 256}) {
        for (auto [hq, kvh] : std::vector<std::pair<int64_t, int64_t>>{{8, 2}, {7, 7}}) {
          // Emulated: every fifth case, which takes both batches, every dtype, head_dim and head
          // layout, and the tensor-core kernel over both 16-bit caches.
          if (++case_index % 5 != 0 && kEmulated) continue;
          AttentionCase c(hd, hq, kvh, prompts);
          c.g.dtype = dt;
          const size_t cache_elems = c.g.num_layers * c.g.elements_per_layer();
          // Both caches as the dtype stores them.
          std::vector<uint16_t> k16(cache_elems), v16(cache_elems);
          for (size_t i = 0; i < cache_elems && dt != DType::kF32; ++i) {
            k16[i] = dt == DType::kBF16 ? F32ToBf16(c.kc[i]) : F32ToF16(c.kc[i]);
            v16[i] = dt == DType::kBF16 ? F32ToBf16(c.vc[i]) : F32ToF16(c.vc[i]);
          }
          void* kc_host = dt == DType::kF32 ? static_cast<void*>(c.kc.data()) : k16.data();
          void* vc_host = dt == DType::kF32 ? static_cast<void*>(c.vc.data()) : v16.data();
          const auto up_cache = [&](const std::vector<float>& f,
                                    const std::vector<uint16_t>& h) -> void* {
            return dt == DType::kF32 ? static_cast<void*>(Up(f)) : static_cast<void*>(Up(h));
          };
          void *kcg = up_cache(c.kc, k16), *vcg = up_cache(c.vc, v16);
          const AttentionMetadata md = OnDevice(c);
          const float *qg = Up(c.q), *kg = Up(c.k), *vg = Up(c.v);
          cuda::PagedAttentionArgs a = CudaBackend::AttentionArgs(
              qg, kg, vg, kcg, vcg, c.g, c.layer, md, hq, c.scale(), Zeros(c.n * hq * hd));
          a.mode = cuda::AttentionMode::kTiled;
          ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<float> tiled = Down(a.out, c.n * hq * hd);
          std::vector<float> ref(c.n * hq * hd);
          cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), kc_host, vc_host, c.g, c.layer,
                               c.Host(), hq, c.scale(), ref.data());
          EXPECT_LE(MaxRelDiff(tiled, ref), 1e-4f)
              << DTypeName(dt) << " head_dim " << hd << " heads " << hq << "/" << kvh;
          // The split-KV kernel's own result, for the short sequences the backend leaves to it.
          a.mode = cuda::AttentionMode::kInBlock;
          a.out = Zeros(c.n * hq * hd);
          ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<float> split = Down(a.out, c.n * hq * hd);
          ASSERT_TRUE(cuda::TiledPrefillPays(a));
          float* out = Zeros(c.n * hq * hd);
          gpu_->PagedAttention(qg, kg, vg, kcg, vcg, c.g, c.layer, md, hq, c.scale(), out);
          const std::vector<float> got = Down(out, c.n * hq * hd);
          EXPECT_LE(MaxRelDiff(got, ref), 1e-4f)
              << "kAuto, " << DTypeName(dt) << " head_dim " << hd;
          // kAuto: sequences of at least kMinTiledNewTokens new tokens tiled, the others split-KV.
          const size_t row = static_cast<size_t>(hq * hd);
          for (size_t s = 0; s + 1 < c.seq_indptr.size(); ++s) {
            const bool tiled_seq =
                c.seq_indptr[s + 1] - c.seq_indptr[s] >= cuda::kMinTiledNewTokens;
            const std::vector<float>& want = tiled_seq ? tiled : split;
            for (int32_t t = c.seq_indptr[s]; t < c.seq_indptr[s + 1]; ++t) {
              EXPECT_TRUE(std::equal(got.begin() + t * row, got.begin() + (t + 1) * row,
                                     want.begin() + t * row))
                  << "token " << t << " (sequence " << s << ") not from the "
                  << (tiled_seq ? "tiled" : "split-KV") << " kernel: " << DTypeName(dt)
                  << " head_dim " << hd;
            }
          }
          // The tensor-core prompt kernel (16-bit caches, head_dim 64 and 128): queries and
          // probabilities rounded to the cache's type, so within BF16's (F16's) rounding of the
          // CPU; and kAuto with it on partitions the tokens the same way.
          cuda::PagedAttentionArgs tc = a;
          tc.mode = cuda::AttentionMode::kTensorCore;
          tc.out = Zeros(c.n * hq * hd);
          if (!cuda::TensorCorePrefillCapable(tc)) {
            EXPECT_EQ(cuda::LaunchPagedAttention(tc, nullptr), cudaErrorInvalidValue)
                << DTypeName(dt) << " " << hd;
            continue;
          }
          ASSERT_EQ(cuda::LaunchPagedAttention(tc, nullptr), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<float> tensor = Down(tc.out, c.n * hq * hd);
          // (A model of the kernel's rounding on these inputs: 5.2e-3 in BF16, 6.6e-4 in F16; an
          // off-by-one mask, a missing rescale or a dropped key tile: 0.75 and more.)
          EXPECT_LE(MaxRelDiff(tensor, ref), dt == DType::kBF16 ? 2e-2f : 4e-3f)
              << "tensor cores, " << DTypeName(dt) << " head_dim " << hd << " heads " << hq << "/"
              << kvh;
          tc.mode = cuda::AttentionMode::kAuto;
          // As CudaBackend::PagedAttention sets it outside the batch-invariant mode.
          tc.allow_tiled = true;
          tc.tensor_core_prefill = true;
          tc.out = Zeros(c.n * hq * hd);
          ASSERT_EQ(cuda::LaunchPagedAttention(tc, nullptr), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<float> auto_tc = Down(tc.out, c.n * hq * hd);
          for (size_t s = 0; s + 1 < c.seq_indptr.size(); ++s) {
            const bool tiled_seq =
                c.seq_indptr[s + 1] - c.seq_indptr[s] >= cuda::kMinTiledNewTokens;
            const std::vector<float>& want = tiled_seq ? tensor : split;
            for (int32_t t = c.seq_indptr[s]; t < c.seq_indptr[s + 1]; ++t) {
              EXPECT_TRUE(std::equal(auto_tc.begin() + t * row, auto_tc.begin() + (t + 1) * row,
                                     want.begin() + t * row))
                  << "token " << t << " (sequence " << s << ") not from the "
                  << (tiled_seq ? "tensor-core" : "split-KV") << " kernel: " << DTypeName(dt)
                  << " head_dim " << hd;
            }
          }
        }
      }
    }
}

TEST_F(CudaBackendTest, SplitKvAttentionIsBitIdenticalInEveryModeAndBatch) {
  for (int64_t hd : {32, 64, 128, 256}) {
    AttentionCase c(hd, 16, 2, kMixedBatch);
    const AttentionMetadata md = OnDevice(c);
    cuda::PagedAttentionArgs a = CudaBackend::AttentionArgs(
        Up(c.q), Up(c.k), Up(c.v), Up(c.kc), Up(c.vc), c.g, c.layer, md, c.hq, c.scale(), nullptr);
    std::map<std::string, std::vector<float>> outs;
    float* batch_workspace = nullptr;
    int64_t batch_workspace_floats = 0;
    for (auto [name, mode] : std::vector<std::pair<std::string, cuda::AttentionMode>>{
             {"in-block", cuda::AttentionMode::kInBlock},
             {"grid-split", cuda::AttentionMode::kGridSplit}}) {
      a.mode = mode;
      a.workspace_floats = cuda::SplitAttentionWorkspaceFloats(a);
      a.workspace = a.workspace_floats > 0 ? Zeros(a.workspace_floats) : nullptr;
      if (a.workspace != nullptr)
        batch_workspace = a.workspace, batch_workspace_floats = a.workspace_floats;
      a.out = Zeros(c.n * c.hq * hd);
      ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess) << name;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      outs[name] = Down(a.out, c.n * c.hq * hd);
      // Again over the same workspace: the split blocks' counters are back at zero, so the last
      // block of each token and head merges again (a stale count would leave outputs unwritten).
      a.out = Zeros(c.n * c.hq * hd);
      ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess) << name;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(Down(a.out, c.n * c.hq * hd), outs[name])
          << name << ", launched again, head_dim " << hd;
    }
    ASSERT_GT(cuda::SplitAttentionWorkspaceFloats(a), 0) << "the grid-split case must really split";
    EXPECT_EQ(outs["in-block"], outs["grid-split"]) << "head_dim " << hd;
    // The 700-token decode alone (token 58 of the batch, sequence 3): the same bits as in the
    // batch.
    const int64_t t = c.seq_indptr[3];
    std::vector<int32_t> table(c.blocks.begin() + c.block_indptr[3],
                               c.blocks.begin() + c.block_indptr[4]);
    a.num_tokens = 1;
    a.num_seqs = 1;
    a.max_context_len = 701;
    a.seq_indptr = Up(std::vector<int32_t>{0, 1});
    a.positions = Up(std::vector<int32_t>{c.positions[t]});
    a.context_lens = Up(std::vector<int32_t>{701});
    a.block_indptr = Up(std::vector<int32_t>{0, static_cast<int32_t>(table.size())});
    a.block_indices = Up(table);
    a.slot_mapping = Up(std::vector<int32_t>{c.slots[t]});
    const size_t row = c.hq * hd, kv_row = c.g.num_kv_heads * hd;
    a.q = Up(std::vector<float>(c.q.begin() + t * row, c.q.begin() + (t + 1) * row));
    a.k = Up(std::vector<float>(c.k.begin() + t * kv_row, c.k.begin() + (t + 1) * kv_row));
    a.v = Up(std::vector<float>(c.v.begin() + t * kv_row, c.v.begin() + (t + 1) * kv_row));
    for (cuda::AttentionMode mode : {cuda::AttentionMode::kAuto, cuda::AttentionMode::kInBlock,
                                     cuda::AttentionMode::kGridSplit}) {
      a.mode = mode;
      // The batch's workspace again, as the backend reuses its scratch: this launch's partials and
      // counters lie where the batch's partials were.
      a.workspace_floats = cuda::SplitAttentionWorkspaceFloats(a);
      ASSERT_LE(a.workspace_floats, batch_workspace_floats);
      a.workspace = a.workspace_floats > 0 ? batch_workspace : nullptr;
      a.out = Zeros(row);
      ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(Down(a.out, row), std::vector<float>(outs["in-block"].begin() + t * row,
                                                     outs["in-block"].begin() + (t + 1) * row))
          << "head_dim " << hd << ", mode " << static_cast<int>(mode);
    }
  }
}

// Grid splits shorter than the in-block 256 keys (PagedAttentionArgs::grid_split_keys): the CPU's
// results within rounding for every length (the batch's contexts of 1 to 701 keys cross many split
// boundaries), relaunched over the same workspace; past kMaxGridSplits splits the keys double; a
// value the kernel does not take is refused with nothing written; the backend's variable reaches
// the launch.
TEST_F(CudaBackendTest, ShorterGridSplitsMatchTheCpu) {
  for (int64_t hd : {64, 128}) {
    AttentionCase c(hd, 16, 2, kMixedBatch);
    const AttentionMetadata md = OnDevice(c);
    std::vector<float> ref(c.n * c.hq * hd), kc = c.kc, vc = c.vc;
    cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), kc.data(), vc.data(), c.g, c.layer,
                         c.Host(), c.hq, c.scale(), ref.data());
    cuda::PagedAttentionArgs a = CudaBackend::AttentionArgs(
        Up(c.q), Up(c.k), Up(c.v), Up(c.kc), Up(c.vc), c.g, c.layer, md, c.hq, c.scale(), nullptr);
    a.mode = cuda::AttentionMode::kGridSplit;
    for (int64_t keys : {32, 64, 128}) {
      a.grid_split_keys = keys;
      a.workspace_floats = cuda::SplitAttentionWorkspaceFloats(a);
      // 701 keys: 22, 11 and 6 splits of each token's (token, KV head) blocks.
      ASSERT_EQ(a.workspace_floats, 4096 + c.n * c.hq * ((701 + keys - 1) / keys) * (hd + 2))
          << keys;
      a.workspace = Zeros(a.workspace_floats);
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        a.out = Zeros(c.n * c.hq * hd);
        ASSERT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaSuccess) << keys;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> out = Down(a.out, ref.size());
        EXPECT_LE(MaxRelDiff(out, ref), 1e-4f)
            << "head_dim " << hd << ", splits of " << keys << " keys, run " << run;
        if (run == 0)
          first = out;
        else
          EXPECT_EQ(out, first) << "relaunched over the same workspace, splits of " << keys
                                << " keys";
      }
    }
    // 5000 keys in splits of 32 would be 157: the keys double to 128 (40 splits), the workspace
    // says so.
    cuda::PagedAttentionArgs long_context = a;
    long_context.grid_split_keys = 32;
    long_context.max_context_len = 5000;
    EXPECT_EQ(cuda::SplitAttentionWorkspaceFloats(long_context), 4096 + c.n * c.hq * 40 * (hd + 2));
    a.grid_split_keys = 48;
    EXPECT_EQ(cuda::SplitAttentionWorkspaceFloats(a), 0);
    a.out = Zeros(c.n * c.hq * hd);
    EXPECT_EQ(cuda::LaunchPagedAttention(a, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(Down(a.out, ref.size()), std::vector<float>(ref.size(), 0.f)) << "nothing written";
  }
  // Through the backend: TANDEM_CUDA_GRID_SPLIT_KEYS=64 splits a lone 701-key decode into 11
  // blocks' worth of partials (other bits than 256-key splits, the same values within rounding).
  AttentionCase c(128, 16, 2, {{700, 1}});
  ::setenv("TANDEM_CUDA_GRID_SPLIT_KEYS", "64", 1);
  auto short_splits = CudaBackend::Create({});
  ::unsetenv("TANDEM_CUDA_GRID_SPLIT_KEYS");
  ASSERT_TRUE(short_splits.ok()) << short_splits.status();
  EXPECT_NE((*short_splits)->device_description().find("grid splits of 64 keys"),
            std::string::npos);
  std::vector<float> ref(c.n * c.hq * 128), kc = c.kc, vc = c.vc;
  cpu_->PagedAttention(c.q.data(), c.k.data(), c.v.data(), kc.data(), vc.data(), c.g, c.layer,
                       c.Host(), c.hq, c.scale(), ref.data());
  const AttentionMetadata md = OnDevice(c);
  std::map<std::string, std::vector<float>> outs;
  for (auto [name, backend] : std::vector<std::pair<std::string, CudaBackend*>>{
           {"64", short_splits->get()}, {"256", gpu_.get()}}) {
    float* out = Zeros(ref.size());
    backend->PagedAttention(Up(c.q), Up(c.k), Up(c.v), Up(c.kc), Up(c.vc), c.g, c.layer, md, c.hq,
                            c.scale(), out);
    ASSERT_EQ(cudaDeviceSynchronize(),
              cudaSuccess);  // the other backend's stream, then this one's copy
    ASSERT_TRUE(backend->CheckErrors().ok()) << backend->CheckErrors();
    outs[name] = Down(out, ref.size());
    EXPECT_LE(MaxRelDiff(outs[name], ref), 1e-4f)
        << "splits of " << name << " keys through the backend";
  }
  EXPECT_NE(outs["64"], outs["256"]) << "TANDEM_CUDA_GRID_SPLIT_KEYS=64 did not reach the launch";
}

}  // namespace
}  // namespace tandem::cuda_test
