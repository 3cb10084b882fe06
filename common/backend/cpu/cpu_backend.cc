#include "common/backend/cpu/cpu_backend.h"

#include "common/base/argmax.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/attention.h"
#include "common/backend/cpu/bf16_kernels.h"
#include "common/backend/cpu/cpu_kernels.h"
#include "common/backend/cpu/quant_a8_kernels.h"
#include "common/backend/cpu/quant_kernels.h"

namespace tandem {
namespace {

class HostBuffer final : public DeviceBuffer {
 public:
  explicit HostBuffer(size_t bytes)
      : bytes_(bytes), data_(new (std::align_val_t(64)) std::byte[bytes]) {}
  ~HostBuffer() override { ::operator delete[](data_, std::align_val_t(64)); }
  void* data() override { return data_; }
  size_t size() const override { return bytes_; }

 private:
  size_t bytes_;
  std::byte* data_;
};

// Target size of one converted weight tile for the GEMM path.
constexpr int64_t kTileBytes = 1 << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const Options& options) {
  if (!cpu::Prefetch().error.empty()) return absl::InvalidArgumentError(cpu::Prefetch().error);
  ThreadPool* pool = options.pool ? options.pool : &ThreadPool::Default();
  openblas_set_num_threads(1);
  auto backend = std::unique_ptr<CpuBackend>(new CpuBackend(pool, options.batch_invariant));
  backend->activations_ = options.activations;
  return backend;
}

std::string CpuBackend::device_description() const {
  return absl::StrCat(
      "cpu (", pool_->num_threads(), " threads, ",
      cpu::HaveAvx512() ? "avx512"
      : cpu::HaveAvx2() ? "avx2+fma"
                        : "portable",
      " kernels, ", batch_invariant_ ? "batch-invariant Linear" : "OpenBLAS GEMM",
      activations_ == ActivationDType::kInt8
          ? (cpu::HaveAvx512Vnni() ? ", int8 activations (vnni)"
                                   : ", int8 activations (portable: no vnni)")
      : activations_ == ActivationDType::kBF16
          ? (cpu::HaveAvx512Bf16() ? ", bf16 activations (avx512_bf16)"
                                   : ", bf16 activations (f32 kernels: no avx512_bf16)")
          : "",
      cpu::Prefetch().overridden ? absl::StrCat(", prefetch ", cpu::Prefetch().bytes, " B",
                                                cpu::Prefetch().batch1 ? " with batch 1" : "")
                                 : "",
      ")");
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CpuBackend::Allocate(size_t bytes) {
  try {
    return std::unique_ptr<DeviceBuffer>(new HostBuffer(std::max<size_t>(bytes, 64)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
  }
}

void CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

absl::StatusOr<DeviceWeight> CpuBackend::UploadWeight(const TensorView& t) {
  DeviceWeight w;
  if (t.shape.size() == 1) {
    w.rows = 1;
    w.cols = t.shape[0];
    auto storage = std::shared_ptr<float[]>(new float[std::max<int64_t>(w.cols, 1)]);
    ConvertToF32(t.dtype, t.data, storage.get(), static_cast<size_t>(w.cols));
    w.dtype = DType::kF32;
    w.data = storage.get();
    w.owner = std::shared_ptr<void>(storage, storage.get());
    return w;
  }
  if (t.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(t.file, ": tensor ", t.name, " has rank ",
                                                   t.shape.size(), ", expected 1 or 2"));
  }
  // 2-D weights stay in the mapping, in their own dtype.
  w.dtype = t.dtype;
  w.rows = t.shape[0];
  w.cols = t.shape[1];
  w.data = t.data;
  return w;
}

absl::StatusOr<DeviceWeight> CpuBackend::UploadQuantizedWeight(
    std::shared_ptr<const QuantizedMatrix> m) {
  if (absl::Status s = Validate(*m, "quantized weight"); !s.ok()) return s;
  DeviceWeight w;
  w.quant = m->type;
  w.rows = m->rows;
  w.cols = m->cols;
  w.group_size = m->group_size;
  w.data = m->codes.data();
  w.scales = m->scales.data();
  w.zeros = m->zeros.empty() ? nullptr : m->zeros.data();
  w.perm = m->perm.empty() ? nullptr : m->perm.data();
  w.owner = std::const_pointer_cast<QuantizedMatrix>(std::move(m));
  return w;
}

void CpuBackend::Embedding(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out) {
  const int64_t d = table.cols;
  const size_t row_bytes = static_cast<size_t>(d) * DTypeSize(table.dtype);
  pool_->ParallelFor(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto* row = static_cast<const std::byte*>(table.data) + ids[i] * row_bytes;
      cpu::ToF32(row, table.dtype, out + i * d, d);
    }
  });
}

void CpuBackend::RmsNorm(const float* x, const DeviceWeight& weight, float eps, int64_t n,
                         int64_t d, float* out) {
  const float* w = static_cast<const float*>(weight.data);
  pool_->ParallelFor(n, std::max<int64_t>(1, 4096 / std::max<int64_t>(d, 1)),
                     [&](int64_t b, int64_t e) {
                       for (int64_t i = b; i < e; ++i) {
                         const float* xi = x + i * d;
                         double ss = 0;
                         for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xi[j]) * xi[j];
                         const float inv = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
                         float* oi = out + i * d;
                         for (int64_t j = 0; j < d; ++j) oi[j] = xi[j] * inv * w[j];
                       }
                     });
}

namespace {

// A grain for ParallelFor over `total` elements of an elementwise op costing a few nanoseconds
// each: chunks of at least 1,024 elements, as many as the threads (or a multiple of them) so that
// they end together. A decode step's SiLU over 4,864 elements in chunks of 4,096 left one thread
// 4,096 exps to the other's 768.
int64_t ElementwiseGrain(int64_t total, int64_t threads) {
  constexpr int64_t kMinGrain = 1024;
  const int64_t chunks = std::max<int64_t>(1, std::min(4 * threads, total / kMinGrain));
  // Fewer chunks than threads: as many as there are (each of at least kMinGrain).
  const int64_t even = chunks >= threads ? chunks / threads * threads : chunks;
  return (total + even - 1) / even;
}

// The tiles of a Linear of m weight rows and n activation rows, on the pool: fn(first weight row,
// weight rows (at most 24), first activation row, activation rows (at most 8)) per tile. Items are
// a block of up to 64 activation rows × a tile of 24 weight rows, activation-block-major: a thread
// keeps its block in L2 while the weight tiles stream past (a 512-token prefill's activations
// re-read from L3 for every weight tile ran at half the speed). Every output is one kernel call's,
// whatever n (batch invariance).
template <typename Fn>
void ForEachTile(ThreadPool* pool, int64_t m, int64_t n, const Fn& fn) {
  constexpr int64_t kRowTile = 24, kTokenGroup = 8, kActBlock = 64;
  const int64_t tiles = (m + kRowTile - 1) / kRowTile, blocks = (n + kActBlock - 1) / kActBlock;
  pool->ParallelFor(tiles * blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t item = b; item < e; ++item) {
      const int64_t j0 = (item % tiles) * kRowTile, i_begin = (item / tiles) * kActBlock;
      const int rows_w = static_cast<int>(std::min(kRowTile, m - j0));
      for (int64_t i0 = i_begin; i0 < std::min(n, i_begin + kActBlock); i0 += kTokenGroup)
        fn(j0, rows_w, i0, static_cast<int>(std::min(kTokenGroup, n - i0)));
    }
  });
}

// Batch 1's Linear, which reads every weight once: fn(projection, first row, end row) over runs of
// whole weight rows (row_bytes each) of the projections' weights read as one, on the pool (a run
// that reaches the end of one weight goes on as a run of the next), which the kernels stream
// (cpu::DotRowsStreamed). Each thread claims its next run when it has finished the last, and a
// run is the rows left ÷ the threads (guided scheduling) but at least 1 MiB and 16 rows (and at
// most an equal share): the first runs are long streams, the last short, so the threads end nearly
// together. Fixed runs (as many as the threads, or up to four a thread) could leave the thread that
// drew less bandwidth most of a run behind with the other waiting, 34 MB of Qwen2.5-0.5B's LM head.
// Runs under 1 MiB do not get their streams going (a 1.6 MB matrix in four runs a thread read at
// 32 GB/s, against 47-50 for large ones).
template <typename Fn>
void ForEachRowRun(ThreadPool* pool, absl::Span<const Backend::Projection> ps, size_t row_bytes,
                   const Fn& fn) {
  constexpr int64_t kMinRunBytes = int64_t{1} << 20;
  constexpr int64_t kMinRows = 16;  // four rows a stream
  int64_t m = 0;
  for (const Backend::Projection& p : ps) m += p.w->rows;
  const int64_t threads = pool->num_threads();
  // A run: at least 1 MiB (and 16 rows), at most an equal share of the whole.
  const int64_t min_run =
      std::min((m + threads - 1) / threads,
               std::max<int64_t>(
                   kMinRows, kMinRunBytes / std::max<int64_t>(1, static_cast<int64_t>(row_bytes))));
  std::atomic<int64_t> next{0};  // the first row not claimed
  // One task a thread (a thread that finds none left returns); each claims runs until none is left.
  pool->ParallelFor(threads, 1, [&](int64_t, int64_t) {
    int64_t b = next.load(std::memory_order_relaxed);
    while (b < m) {
      const int64_t run = std::min(m - b, std::max(min_run, (m - b + threads - 1) / threads));
      if (!next.compare_exchange_weak(b, b + run, std::memory_order_relaxed)) continue;
      int64_t e = b + run, first = 0;  // first: the row of the whole that is weight s's row 0
      for (size_t s = 0; s < ps.size() && b < e; first += ps[s].w->rows, ++s) {
        const int64_t end = first + ps[s].w->rows, stop = std::min(e, end);
        if (b >= end) continue;
        fn(s, b - first, stop - first);
        b = stop;
      }
      b = next.load(std::memory_order_relaxed);
    }
  });
}

// A quantized weight's rows, as the kernels read them.
cpu::QuantRows WeightRows(const DeviceWeight& w) {
  cpu::QuantRows q;
  q.type = w.quant;
  q.cols = w.cols;
  q.group_size = w.group_size;
  q.groups = (w.cols + w.group_size - 1) / w.group_size;
  q.row_bytes = static_cast<size_t>(w.quant == QuantType::kInt4 ? w.cols / 2 : w.cols);
  q.codes = static_cast<const uint8_t*>(w.data);
  q.scales = w.scales;
  q.zeros = w.zeros;
  return q;
}

// x[n][k] in stored column order (act-order weights: stored column c is x's column perm[c]),
// written into *buffer; x itself when there is no permutation.
const float* InStoredOrder(const float* x, int64_t n, int64_t k, const int32_t* perm,
                           std::vector<float>* buffer) {
  if (perm == nullptr) return x;
  buffer->resize(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < k; ++c) (*buffer)[i * k + c] = x[i * k + perm[c]];
  }
  return buffer->data();
}

// out[n][m] += bias[m] (none: nothing).
void AddBias(const DeviceWeight* bias, int64_t n, int64_t m, float* out) {
  if (bias == nullptr) return;
  const float* bv = static_cast<const float*>(bias->data);
  for (int64_t i = 0; i < n; ++i) {
    float* oi = out + i * m;
    for (int64_t j = 0; j < m; ++j) oi[j] += bv[j];
  }
}

// ForEachTile for quantized weights: kernel(first activation row, rows, the tile's weight rows,
// their count, out at the tile).
template <typename Kernel>
void QuantTiles(ThreadPool* pool, const cpu::QuantRows& q, int64_t m, int64_t n, float* out,
                const Kernel& kernel) {
  ForEachTile(pool, m, n, [&](int64_t j0, int rows_w, int64_t i0, int rows_x) {
    kernel(i0, rows_x, q.RowsFrom(j0), rows_w, out + i0 * m + j0);
  });
}

}  // namespace

void CpuBackend::QuantizedLinear(const float* x, int64_t n, const DeviceWeight& w, float* out) {
  if (n <= cpu::kStreamedMaxRows) {
    const Projection p{&w, nullptr, out};
    return QuantizedStreamedRows(x, n, {&p, 1});
  }
  const int64_t m = w.rows, k = w.cols;
  const cpu::QuantRows q = WeightRows(w);
  // The activations in stored column order (act-order weights), and their group sums.
  thread_local std::vector<float> permuted, sums;
  x = InStoredOrder(x, n, k, w.perm, &permuted);
  if (activations_ == ActivationDType::kInt8) return QuantizedLinearA8(x, n, m, q, out);
  sums.resize(static_cast<size_t>(n * q.groups));
  if (w.zeros != nullptr) {
    for (int64_t i = 0; i < n; ++i)
      cpu::QuantGroupSums(x + i * k, k, q.group_size, &sums[i * q.groups]);
  }
  const float* xsum_base = sums.data();
  // Past cpu::kStreamedMaxRows rows (fewer stream above): the tiles where batch invariance is asked
  // for, else SGEMM.
  if (batch_invariant_) {
    QuantTiles(pool_, q, m, n, out,
               [&](int64_t i0, int rows, const cpu::QuantRows& tile, int tile_rows, float* o) {
                 const float* xs[8];
                 const float* ss[8];
                 for (int r = 0; r < rows; ++r) {
                   xs[r] = x + (i0 + r) * k;
                   ss[r] = xsum_base + (i0 + r) * q.groups;
                 }
                 cpu::QuantDotTile(xs, rows, ss, tile, tile_rows, o, m);
               });
    return;
  }
  // Larger batches without batch invariance: dequantize tiles of rows and SGEMM them.
  const int64_t tile_rows = std::clamp<int64_t>(kTileBytes / (4 * k), 16, 512);
  pool_->ParallelFor((m + tile_rows - 1) / tile_rows, 1, [&](int64_t tb, int64_t te) {
    thread_local std::vector<float> tile;
    for (int64_t t = tb; t < te; ++t) {
      const int64_t r0 = t * tile_rows, rows = std::min(tile_rows, m - r0);
      tile.resize(static_cast<size_t>(rows * k));
      cpu::DequantizeRows(q.RowsFrom(r0), rows, tile.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                  static_cast<int>(rows), static_cast<int>(k), 1.0f, x, static_cast<int>(k),
                  tile.data(), static_cast<int>(k), 0.0f, out + r0, static_cast<int>(m));
    }
  });
}

void CpuBackend::QuantizedLinearA8(const float* x, int64_t n, int64_t m, const cpu::QuantRows& q,
                                   float* out) {
  thread_local cpu::QuantizedActivations quantized;
  const cpu::QuantizedActivations& a = quantized;  // the caller's, captured by the pool's tasks
  cpu::QuantizeActivations(x, n, q, &quantized);
  // As the f32 path's tiles, for every batch size (up to 8 rows stream, QuantizedStreamedRows):
  // integer products need no SGEMM to be fast.
  QuantTiles(pool_, q, m, n, out,
             [&](int64_t i0, int rows, const cpu::QuantRows& tile, int tile_rows, float* o) {
               cpu::QuantDotTileA8(a, i0, rows, tile, tile_rows, o, m);
             });
}

void CpuBackend::LinearBf16(const float* x, int64_t n, const DeviceWeight& w, float* out) {
  if (n <= cpu::kStreamedMaxRows && cpu::HaveAvx512Bf16()) {
    const Projection p{&w, nullptr, out};
    return Bf16StreamedRows(x, n, {&p, 1});
  }
  const int64_t m = w.rows, k = w.cols, kp = cpu::Bf16PaddedCols(k);
  thread_local std::vector<uint16_t> rounded;
  rounded.resize(static_cast<size_t>(n * kp));
  cpu::RoundRowsToBf16(x, n, k, rounded.data());
  const uint16_t* xb = rounded.data();  // the caller's, captured by the pool's tasks
  if (!cpu::HaveAvx512Bf16()) {
    // The f32 kernels on the rounded activations: the same inputs, other sums.
    thread_local std::vector<float> widened;
    widened.resize(static_cast<size_t>(n * k));
    for (int64_t i = 0; i < n; ++i) ConvertToF32(DType::kBF16, xb + i * kp, &widened[i * k], k);
    return LinearF32(widened.data(), n, w, out);
  }
  const auto* wb = static_cast<const uint16_t*>(w.data);
  ForEachTile(pool_, m, n, [&](int64_t j0, int rows_w, int64_t i0, int rows_x) {
    cpu::Bf16DotTile(xb + i0 * kp, kp, rows_x, wb + j0 * k, rows_w, k, out + i0 * m + j0, m);
  });
}

void CpuBackend::LinearF32(const float* x, int64_t n, const DeviceWeight& w, float* out) {
  const int64_t m = w.rows, k = w.cols;
  const size_t row_bytes = static_cast<size_t>(k) * DTypeSize(w.dtype);
  const auto* wbytes = static_cast<const std::byte*>(w.data);
  if (n <= cpu::kStreamedMaxRows) {
    const Projection p{&w, nullptr, out};
    StreamedRows(x, n, {&p, 1});
  } else if (batch_invariant_) {
    // Every output element is one Dot, so results do not depend on n.
    ForEachTile(pool_, m, n, [&](int64_t j0, int rows_w, int64_t i0, int rows_x) {
      const float* xs[8];
      for (int r = 0; r < rows_x; ++r) xs[r] = x + (i0 + r) * k;
      cpu::DotTile(xs, rows_x, wbytes + j0 * row_bytes, row_bytes, rows_w, w.dtype, k,
                   out + i0 * m + j0, m);
    });
  } else {
    // Each thread takes tiles of weight rows, converts a 16-bit tile to f32 in a thread-local
    // buffer, and runs a single-threaded GEMM into the matching output columns. Threading stays in
    // one pool (OpenBLAS is set to one thread) so the two never oversubscribe the cores.
    const int64_t tile_rows = std::clamp<int64_t>(kTileBytes / (4 * k), 16, 512);
    const int64_t num_tiles = (m + tile_rows - 1) / tile_rows;
    pool_->ParallelFor(num_tiles, 1, [&](int64_t tb, int64_t te) {
      thread_local std::vector<float> tile;
      for (int64_t t = tb; t < te; ++t) {
        const int64_t r0 = t * tile_rows;
        const int64_t rows = std::min(tile_rows, m - r0);
        const float* wf;
        if (w.dtype == DType::kF32) {
          wf = static_cast<const float*>(w.data) + r0 * k;
        } else {
          tile.resize(static_cast<size_t>(rows * k));
          cpu::ToF32(wbytes + r0 * row_bytes, w.dtype, tile.data(), rows * k);
          wf = tile.data();
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                    static_cast<int>(rows), static_cast<int>(k), 1.0f, x, static_cast<int>(k), wf,
                    static_cast<int>(k), 0.0f, out + r0, static_cast<int>(m));
      }
    });
  }
}

void CpuBackend::Linear(const float* x, int64_t n, const DeviceWeight& w, const DeviceWeight* bias,
                        float* out) {
  if (w.quant != QuantType::kNone) {
    QuantizedLinear(x, n, w, out);
  } else if (RoundsToBf16(w)) {
    LinearBf16(x, n, w, out);
  } else {
    LinearF32(x, n, w, out);
  }
  AddBias(bias, n, w.rows, out);
}

void CpuBackend::LinearEach(const float* x, int64_t n, absl::Span<const Projection> projections) {
  if (projections.empty() || !StreamsTogether(n, projections)) {
    return Backend::LinearEach(x, n, projections);
  }
  StreamedRows(x, n, projections);
  for (const Projection& p : projections) AddBias(p.bias, n, p.w->rows, p.out);
}

bool CpuBackend::StreamsTogether(int64_t n, absl::Span<const Projection> projections) const {
  return n <= cpu::kStreamedMaxRows && ReadAlike(projections);
}

bool CpuBackend::ReadAlike(absl::Span<const Projection> projections) const {
  const DeviceWeight& w0 = *projections[0].w;
  // BF16 activations over BF16 weights stream with AVX-512 BF16 (the others run LinearF32 on the
  // rounded rows, a Linear each).
  if (RoundsToBf16(w0) && !cpu::HaveAvx512Bf16()) return false;
  for (const Projection& p : projections) {
    const DeviceWeight& w = *p.w;
    if (w.quant != w0.quant || w.cols != w0.cols || w.perm != w0.perm) return false;
    if (w.quant == QuantType::kNone && w.dtype != w0.dtype) return false;
    if (w.quant != QuantType::kNone &&
        (w.group_size != w0.group_size || (w.zeros == nullptr) != (w0.zeros == nullptr))) {
      return false;
    }
  }
  return true;
}

void CpuBackend::StreamedRows(const float* x, int64_t n, absl::Span<const Projection> projections) {
  const DeviceWeight& w0 = *projections[0].w;
  if (w0.quant != QuantType::kNone) return QuantizedStreamedRows(x, n, projections);
  if (RoundsToBf16(w0) && cpu::HaveAvx512Bf16()) return Bf16StreamedRows(x, n, projections);
  const int64_t k = w0.cols;
  const size_t row_bytes = static_cast<size_t>(k) * DTypeSize(w0.dtype);
  const float* xs[cpu::kStreamedMaxRows];
  for (int64_t i = 0; i < n; ++i) xs[i] = x + i * k;
  ForEachRowRun(pool_, projections, row_bytes, [&](size_t s, int64_t b, int64_t e) {
    const auto* rows = static_cast<const std::byte*>(projections[s].w->data) + b * row_bytes;
    cpu::DotRowsStreamed(xs, static_cast<int>(n), rows, row_bytes, e - b, w0.dtype, k,
                         projections[s].out + b, projections[s].w->rows);
  });
}

void CpuBackend::Bf16StreamedRows(const float* x, int64_t n,
                                  absl::Span<const Projection> projections) {
  const int64_t k = projections[0].w->cols, kp = cpu::Bf16PaddedCols(k);
  thread_local std::vector<uint16_t> rounded;
  rounded.resize(static_cast<size_t>(n * kp));
  cpu::RoundRowsToBf16(x, n, k, rounded.data());
  const uint16_t* xb = rounded.data();  // the caller's, captured by the pool's tasks
  ForEachRowRun(pool_, projections, static_cast<size_t>(k) * 2,
                [&](size_t s, int64_t b, int64_t e) {
                  const auto* rows = static_cast<const uint16_t*>(projections[s].w->data) + b * k;
                  cpu::Bf16DotRowsStreamed(xb, kp, static_cast<int>(n), rows, e - b, k,
                                           projections[s].out + b, projections[s].w->rows);
                });
}

void CpuBackend::QuantizedStreamedRows(const float* x, int64_t n,
                                       absl::Span<const Projection> projections) {
  const DeviceWeight& w0 = *projections[0].w;
  const int64_t k = w0.cols;
  thread_local std::vector<cpu::QuantRows> weights;
  thread_local std::vector<float> permuted, sums;
  weights.clear();
  for (const Projection& p : projections) weights.push_back(WeightRows(*p.w));
  const cpu::QuantRows* rows = weights.data();     // the caller's, captured by the pool's tasks
  x = InStoredOrder(x, n, k, w0.perm, &permuted);  // act-order weights
  const int rows_x = static_cast<int>(n);
  if (activations_ == ActivationDType::kInt8) {
    thread_local cpu::QuantizedActivations quantized;
    cpu::QuantizeActivations(x, n, rows[0], &quantized);
    const cpu::QuantizedActivations& a = quantized;  // the caller's
    ForEachRowRun(pool_, projections, rows[0].row_bytes, [&](size_t s, int64_t b, int64_t e) {
      cpu::QuantDotRowsStreamedA8(a, 0, rows_x, rows[s].RowsFrom(b), e - b, projections[s].out + b,
                                  projections[s].w->rows);
    });
    return;
  }
  const int64_t groups = rows[0].groups;
  sums.resize(static_cast<size_t>(n * groups));
  if (w0.zeros != nullptr) {
    for (int64_t i = 0; i < n; ++i)
      cpu::QuantGroupSums(x + i * k, k, w0.group_size, &sums[i * groups]);
  }
  const float* xs[cpu::kStreamedMaxRows];
  const float* ss[cpu::kStreamedMaxRows];
  for (int64_t i = 0; i < n; ++i) {
    xs[i] = x + i * k;
    ss[i] = sums.data() + i * groups;
  }
  ForEachRowRun(pool_, projections, rows[0].row_bytes, [&](size_t s, int64_t b, int64_t e) {
    cpu::QuantDotRowsStreamed(xs, rows_x, ss, rows[s].RowsFrom(b), e - b, projections[s].out + b,
                              projections[s].w->rows);
  });
}

void CpuBackend::Rope(float* q, float* k, const int32_t* positions, const float* inv_freq,
                      int64_t n, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  pool_->ParallelFor(n, 1, [&](int64_t b, int64_t e) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t t = b; t < e; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(positions[t]) * inv_freq[i];
        cos_v[i] = std::cos(angle);
        sin_v[i] = std::sin(angle);
      }
      auto rotate = [&](float* base, int64_t heads) {
        for (int64_t h = 0; h < heads; ++h) {
          float* x = base + (t * heads + h) * head_dim;
          for (int64_t i = 0; i < half; ++i) {
            const float x0 = x[i], x1 = x[i + half];
            x[i] = x0 * cos_v[i] - x1 * sin_v[i];
            x[i + half] = x1 * cos_v[i] + x0 * sin_v[i];
          }
        }
      };
      rotate(q, num_q_heads);
      rotate(k, num_kv_heads);
    }
  });
}

void CpuBackend::PagedAttention(const float* q, const float* k, const float* v, void* k_cache,
                                void* v_cache, const KvCacheGeometry& g, int64_t layer,
                                const AttentionMetadata& md, int64_t num_q_heads, float scale,
                                float* out) {
  cpu::PagedAttention(*pool_, q, k, v, k_cache, v_cache, g, layer, md, num_q_heads, scale, out);
}

void CpuBackend::SiluMul(const float* gate, const float* up, int64_t n, int64_t d, float* out) {
  pool_->ParallelFor(n * d, ElementwiseGrain(n * d, pool_->num_threads()),
                     [&](int64_t b, int64_t e) { cpu::SiluMul(gate + b, up + b, e - b, out + b); });
}

void CpuBackend::SiluMulPacked(const float* x, int64_t n, int64_t d, float* out) {
  pool_->ParallelFor(n * d, ElementwiseGrain(n * d, pool_->num_threads()),
                     [&](int64_t b, int64_t e) {
                       // Row by row: a row's gate and up halves are d apart.
                       for (int64_t i = b; i < e;) {
                         const int64_t t = i / d, j = i % d, len = std::min(e - i, d - j);
                         const float* row = x + t * 2 * d;
                         cpu::SiluMul(row + j, row + d + j, len, out + i);
                         i += len;
                       }
                     });
}

void CpuBackend::CopyColumns(const float* x, int64_t n, int64_t stride, int64_t offset,
                             int64_t cols, float* out) {
  for (int64_t t = 0; t < n; ++t)
    std::memcpy(out + t * cols, x + t * stride + offset, cols * sizeof(float));
}

void CpuBackend::Add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void CpuBackend::ArgmaxRows(const float* x, int64_t n, int64_t d, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = ArgmaxRow(x + i * d, d);
}

void CpuBackend::GatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d, float* out) {
  for (int64_t i = 0; i < m; ++i) std::memcpy(out + i * d, x + rows[i] * d, d * sizeof(float));
}

}  // namespace tandem
