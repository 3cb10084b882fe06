// The CUDA emulator: this project's .cu files compiled by the host C++ compiler and run on the CPU,
// so that every kernel's logic (indexing, barriers, warp shuffles, the WMMA tiles, graph capture)
// is tested on machines without a GPU, CI included. Each .cu file is compiled with this header
// included first (CMake generates one wrapper .cc a file); runtime.cc, launch.cc and cublas.cc
// implement the CUDA runtime and cuBLAS calls the backend makes, over host memory.
//
// How a launch runs: blocks one after another (in the threads' schedule's order, below); each of a
// block's threads is a fiber (its own stack), run until it reaches a barrier (__syncthreads, or a
// warp op with its mask), so every thread of a block sees the block's __shared__ variables
// (function statics here: blocks never overlap) and every lane of a warp exchanges values at a
// shuffle as on the device. What the device would reject or leave undefined is reported as a launch
// failure, with the kernel, block and thread: a barrier some threads never reach (a deadlock:
// __syncthreads in divergent code, a shuffle naming a lane that exited or waits elsewhere), a
// shuffle reading a lane outside its mask, a block of more than 1024 threads, more than 48 KiB of
// dynamic shared memory without cudaFuncSetAttribute. Dynamic shared memory starts as 0xff bytes
// (NaN floats) in every block, so a read before any write shows. Threads run in index order between
// barriers, or reversed, or shuffled (SetSchedule, TANDEM_CUDA_EMU_SCHEDULE): a missing barrier
// shows as a result that changes with the order. The blocks of a grid run in the same kind of
// order, so a kernel that assumes which block runs last (or first) shows too.
//
// Not emulated: timing, concurrency between streams (work runs when enqueued; a stream being
// captured records it instead; async work, async_work.h, holds its stream until another thread
// completes it), the memory model (every write is visible at once), and device math's last-bit
// differences (expf here is the host's). Misaligned accesses, which fault on the device, are caught
// by UBSan's alignment check in the builds that have it (emu/CMakeLists.txt:
// tandem_cuda_emu_checked).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define TANDEM_CUDA_EMU 1

#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)

namespace tandem_emu {

// The thread a fiber runs (launches are serialised, so one is current at a time).
struct ThreadState {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  int lane;  // within its warp
  int warp;  // within its block
};
extern ThreadState* current;

// Waits until every thread of the block still running has arrived, at the same __syncthreads
// (`file`:`line`).
void SyncThreads(const char* file, int line);
// Publishes `value` for this lane and waits until every lane of `mask` has arrived at a warp op
// (the lanes of one op must pass the same mask); returns the 32 lanes' values (outside the mask:
// unspecified), valid until this lane's next warp op.
const uint64_t* WarpExchange(unsigned mask, uint64_t value);
// Reports a device-side fault (the launch fails with it) and stops the calling thread's block.
[[noreturn]] void Fault(const char* what);
// This block's dynamic shared memory.
unsigned char* DynamicShared();
// The order a block's threads run in between barriers (after a barrier the last thread to arrive
// runs on first), and a grid's blocks run in, for the launches after it: "forward" (by index; the
// default, or TANDEM_CUDA_EMU_SCHEDULE), "reverse" or "random" (a new order each block, seeded by
// TANDEM_CUDA_EMU_SEED). A read that a missing barrier leaves racing gets another value in another
// order. False for any other name.
bool SetSchedule(const char* name);
// When streams run their work (TANDEM_CUDA_EMU_STREAMS; runtime.cc: Enqueue): "eager" (the default)
// when it is enqueued, "deferred" at the synchronisation that needs it, so that a read not ordered
// after a write on another stream sees the old bytes, and a launch's failure is reported by the
// synchronisation, as on the device. Switching runs all queued work first. False for any other
// name.
bool SetStreams(const char* name);

// Runs `body` as every thread of a grid on `stream` (now, or at a graph's replay when the stream is
// being captured), after the checks a launch gets on the device. `kernel` identifies the function
// for cudaFuncSetAttribute; `name` names it in reports.
cudaError_t LaunchGrid(const void* kernel, const char* name, dim3 grid, dim3 block,
                       size_t shared_bytes, cudaStream_t stream, std::function<void()> body);

// "a kernel (its parameter types)", from Launch's __PRETTY_FUNCTION__ (a kernel's own name is not
// at hand: most are local symbols). The result lives as long as the program.
const char* KernelName(const char* launch_signature);

// kernel<<<grid, block, shared_bytes, stream>>>(args...): the arguments are converted to the
// kernel's parameter types and copied at the launch, as the device does.
template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args&&... args) {
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  return LaunchGrid(reinterpret_cast<const void*>(kernel), KernelName(__PRETTY_FUNCTION__), grid,
                    block, shared_bytes, stream, [kernel, params] { std::apply(kernel, params); });
}

template <typename T>
uint64_t Bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "a warp op's value is at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T FromBits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
// Lane `src`'s value of a shuffle that read from it; a lane outside `mask` is a fault.
template <typename T>
T ShuffleRead(unsigned mask, const uint64_t* all, int src) {
  if (((mask >> src) & 1u) == 0) Fault("a shuffle read a lane outside its mask");
  return FromBits<T>(all[src]);
}

}  // namespace tandem_emu

// cuda_runtime.h's overload for a kernel (declared for nvcc only).
template <typename... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

#define threadIdx (::tandem_emu::current->thread_idx)
#define blockIdx (::tandem_emu::current->block_idx)
#define blockDim (::tandem_emu::current->block_dim)
#define gridDim (::tandem_emu::current->grid_dim)
constexpr int warpSize = 32;

#define __syncthreads() ::tandem_emu::SyncThreads(__FILE__, __LINE__)
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::tandem_emu::WarpExchange(mask, 0); }
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const uint64_t* all = ::tandem_emu::WarpExchange(mask, ::tandem_emu::Bits(v));
  const int lane = ::tandem_emu::current->lane;
  return ::tandem_emu::ShuffleRead<T>(mask, all, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const uint64_t* all = ::tandem_emu::WarpExchange(mask, ::tandem_emu::Bits(v));
  const int lane = ::tandem_emu::current->lane;
  int src = lane ^ lane_mask;
  if (src / width != lane / width) src = lane;
  return ::tandem_emu::ShuffleRead<T>(mask, all, src);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const uint64_t* all = ::tandem_emu::WarpExchange(mask, ::tandem_emu::Bits(v));
  const int lane = ::tandem_emu::current->lane;
  int src = lane + static_cast<int>(delta);
  if (src / width != lane / width) src = lane;
  return ::tandem_emu::ShuffleRead<T>(mask, all, src);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const uint64_t* all = ::tandem_emu::WarpExchange(mask, ::tandem_emu::Bits(v));
  const int lane = ::tandem_emu::current->lane;
  int src = lane - static_cast<int>(delta);
  if (src < 0 || src / width != lane / width) src = lane;
  return ::tandem_emu::ShuffleRead<T>(mask, all, src);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const uint64_t* all = ::tandem_emu::WarpExchange(mask, predicate != 0);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= (((mask >> l) & 1u) && all[l] != 0 ? 1u : 0u) << l;
  return r;
}
template <typename T>
unsigned __match_any_sync(unsigned mask, T v) {
  const uint64_t mine = ::tandem_emu::Bits(v);
  const uint64_t* all = ::tandem_emu::WarpExchange(mask, mine);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= (((mask >> l) & 1u) && all[l] == mine ? 1u : 0u) << l;
  return r;
}

// Device intrinsics, exactly as the device rounds them (these sources are built without
// contraction).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __expf(float x) { return std::exp(x); }
inline float __uint_as_float(unsigned x) { return ::tandem_emu::FromBits<float>(x); }
inline unsigned __float_as_uint(float x) { return static_cast<unsigned>(::tandem_emu::Bits(x)); }
inline float __int_as_float(int x) {
  return ::tandem_emu::FromBits<float>(static_cast<uint32_t>(x));
}
inline int __float_as_int(float x) { return static_cast<int>(::tandem_emu::Bits(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
using std::isfinite;
using std::isinf;
using std::isnan;

// The device's min and max of two numbers (of their common type).
template <typename A, typename B,
          typename = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
std::common_type_t<A, B> min(A a, B b) {
  using T = std::common_type_t<A, B>;
  return T(b) < T(a) ? T(b) : T(a);
}
template <typename A, typename B,
          typename = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
std::common_type_t<A, B> max(A a, B b) {
  using T = std::common_type_t<A, B>;
  return T(a) < T(b) ? T(b) : T(a);
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
template <typename T>
T __ldcg(const T* p) {
  return *p;
}
// Every write is visible at once here (blocks run one after another).
inline void __threadfence() {}

// atomicAdd: one fiber runs at a time, so a plain read-modify-write is atomic.
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}

// nvcuda::wmma over 16×16×16 tiles: every lane's fragment holds the whole tile (the device spreads
// it over the warp in an unspecified layout, which this project's kernels never index), and every
// lane computes the same product; loads and stores are warp-wide on the device, so each begins with
// the warp's lanes converged, as the device requires.
namespace nvcuda::wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int kRows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int kCols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = kRows * kCols;
  T x[num_elements];  // row-major, whatever the memory layout it was loaded from
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, T v) {
  for (auto& e : f.x) e = v;
}
template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ld) {
  __syncwarp();
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int r = 0; r < F::kRows; ++r) {
    for (int c = 0; c < F::kCols; ++c) {
      f.x[r * F::kCols + c] = std::is_same_v<Layout, col_major> ? p[c * ld + r] : p[r * ld + c];
    }
  }
}
template <int M, int N, int K, typename T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T, void>& f, unsigned ld,
                       layout_t layout) {
  __syncwarp();
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c)
      (layout == mem_col_major ? p[c * ld + r] : p[r * ld + c]) = f.x[r * N + c];
  }
  __syncwarp();
}
// d = a · b + c, products of the 16-bit inputs exact in f32 and summed in f32.
template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC>
void mma_sync(fragment<accumulator, M, N, K, TC, void>& d,
              const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b,
              const fragment<accumulator, M, N, K, TC, void>& c) {
  __syncwarp();
  // Every lane of a warp asks for the same product (each holds the whole tile): the last inputs and
  // result are kept per host thread (one fiber runs at a time), and a lane whose inputs are the
  // same bytes takes the result instead of computing it again, 31 times in 32.
  using A = fragment<matrix_a, M, N, K, TA, LA>;
  using B = fragment<matrix_b, M, N, K, TB, LB>;
  using C = fragment<accumulator, M, N, K, TC, void>;
  struct Last {
    bool valid = false;
    A a;
    B b;
    C c, d;
  };
  static thread_local Last last;
  if (last.valid && std::memcmp(&last.a, &a, sizeof(A)) == 0 &&
      std::memcmp(&last.b, &b, sizeof(B)) == 0 && std::memcmp(&last.c, &c, sizeof(C)) == 0) {
    d = last.d;
    return;
  }
  last.valid = false;
  std::memcpy(&last.a, &a, sizeof(A));
  std::memcpy(&last.b, &b, sizeof(B));
  std::memcpy(&last.c, &c, sizeof(C));  // before d is written: d may be c
  // Each input converted once (16-bit conversions are software on the host), then every output
  // summed over k in ascending order as before; the loop over j is independent sums, which the
  // compiler may vector without changing any of them (no contraction: -ffp-contract=off).
  float af[M * K], bf[K * N], r[M * N];
  for (int i = 0; i < M * K; ++i) af[i] = static_cast<float>(a.x[i]);
  for (int i = 0; i < K * N; ++i) bf[i] = static_cast<float>(b.x[i]);
  for (int i = 0; i < M * N; ++i) r[i] = static_cast<float>(c.x[i]);
  for (int i = 0; i < M; ++i) {
    for (int k = 0; k < K; ++k) {
      const float aik = af[i * K + k];
      for (int j = 0; j < N; ++j) r[i * N + j] += aik * bf[k * N + j];
    }
  }
  for (int i = 0; i < M * N; ++i) d.x[i] = r[i];
  std::memcpy(&last.d, &d, sizeof(C));
  last.valid = true;
}
}  // namespace nvcuda::wmma
