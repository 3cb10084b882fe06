// The CUDA emulator itself (tests/support/cuda_emu): kernels written as for the device, held to
// what the CUDA programming guide says they compute, and to the launches and captures the device
// refuses. The backend's own kernels are tested on the emulator by cuda_backend_emu_test.
#include "tests/support/cuda_emu/cuda_emu.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "tests/support/cuda_emu/async_work.h"

#include "common/backend/cuda/launch.cuh"
#include "gtest/gtest.h"

namespace tandem::cuda {
namespace {

// out[block] = Σ in[block][0..blockDim.x), by warp shuffles and a shared array of warp sums.
__global__ void BlockSum(const int* in, int* out) {
  __shared__ int warp_sums[32];
  int v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += warp_sums[w];
    out[blockIdx.x] = s;
  }
}

// Per lane: the shuffle variants, a ballot and match_any, over a warp whose lane l holds 100 + l.
__global__ void WarpOps(int* out) {
  const int lane = threadIdx.x;
  const int v = 100 + lane;
  int* o = out + lane * 6;
  o[0] = __shfl_sync(0xffffffffu, v, 5);          // lane 5's value
  o[1] = __shfl_down_sync(0xffffffffu, v, 3);     // lane + 3, or its own past the end
  o[2] = __shfl_up_sync(0xffffffffu, v, 3);       // lane - 3, or its own before the start
  o[3] = __shfl_xor_sync(0xffffffffu, v, 1, 16);  // neighbour within a half-warp
  o[4] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
  o[5] = static_cast<int>(__match_any_sync(0xffffffffu, lane / 8));
}

// The first half of the block waits at one __syncthreads, the second half at another.
__global__ void DivergentBarriers(int* out) {
  if (threadIdx.x < blockDim.x / 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

// The second warp returns early; the first then synchronises (the device lets exited threads go).
__global__ void EarlyExitThenBarrier(int* out) {
  __shared__ int first[32];
  if (threadIdx.x >= 32) return;
  first[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = first[31 - threadIdx.x];
}

// Lane 0 waits at __syncthreads while its warp's other lanes wait for it at a shuffle.
__global__ void BarrierAgainstShuffle(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 2);
  }
  out[threadIdx.x] = v;
}

// Lanes 16..31 exit; lanes 0..15 then shuffle with the full mask.
__global__ void ShuffleWithExitedLanes(int* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 1);
}

// Every lane takes part but reads a lane outside the mask it names.
__global__ void ShuffleOutsideMask(int* out) {
  const unsigned mask = threadIdx.x < 16 ? 0x0000ffffu : 0xffff0000u;
  out[threadIdx.x] = __shfl_sync(mask, int(threadIdx.x), 20);
}

// Dynamic shared memory starts as 0xff bytes; reports the first word, then writes and reads it
// back.
__global__ void SharedScratch(unsigned* out) {
  TANDEM_DYNAMIC_SHARED(unsigned, scratch, 16);
  if (threadIdx.x == 0) out[0] = scratch[0];
  scratch[threadIdx.x] = threadIdx.x * 3;
  __syncthreads();
  out[1 + threadIdx.x] = scratch[blockDim.x - 1 - threadIdx.x];
}

__global__ void AddOne(int* p) { p[threadIdx.x] += 1; }

// out[block] = the order blocks finished in (as a kernel's "last block to finish" counts them).
__global__ void BlockTurn(unsigned* count, int* out) {
  if (threadIdx.x == 0)
    out[blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)] = int(atomicAdd(count, 1u));
}

// Thread 0 reads what the last thread writes, with no barrier between: a race.
__global__ void MissingBarrier(int value, int* out) {
  __shared__ int v;
  if (threadIdx.x == 0) v = -1;
  __syncthreads();
  if (threadIdx.x == blockDim.x - 1) v = value;
  if (threadIdx.x == 0) out[0] = v;
}

template <typename T>
T* Device(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> Host(const T* dev, size_t n) {
  std::vector<T> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

TEST(CudaEmulatorTest, BlockReductionSumsEveryBlock) {
  constexpr int kBlocks = 3, kThreads = 256;
  std::vector<int> in(kBlocks * kThreads);
  std::iota(in.begin(), in.end(), 1);
  int* din = Device(in);
  int* dout = Device(std::vector<int>(kBlocks, -1));
  ASSERT_EQ(Launch(BlockSum, kBlocks, kThreads, 0, nullptr, din, dout), cudaSuccess);
  const std::vector<int> out = Host(dout, kBlocks);
  for (int b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(out[b],
              std::accumulate(in.begin() + b * kThreads, in.begin() + (b + 1) * kThreads, 0))
        << b;
  }
  cudaFree(din);
  cudaFree(dout);
}

TEST(CudaEmulatorTest, WarpOpsFollowTheProgrammingGuide) {
  int* dout = Device(std::vector<int>(32 * 6, -1));
  ASSERT_EQ(Launch(WarpOps, 1, 32, 0, nullptr, dout), cudaSuccess);
  const std::vector<int> out = Host(dout, 32 * 6);
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (int l = 0; l < 32; ++l) {
    const int* o = out.data() + l * 6;
    EXPECT_EQ(o[0], 105) << l;
    EXPECT_EQ(o[1], l + 3 < 32 ? 103 + l : 100 + l) << l;
    EXPECT_EQ(o[2], l >= 3 ? 97 + l : 100 + l) << l;
    EXPECT_EQ(o[3], 100 + (l ^ 1)) << l;
    EXPECT_EQ(static_cast<unsigned>(o[4]), ballot) << l;
    EXPECT_EQ(static_cast<unsigned>(o[5]), 0xffu << (8 * (l / 8))) << l;
  }
  cudaFree(dout);
}

TEST(CudaEmulatorTest, BarriersThreadsCannotAllReachFailTheLaunch) {
  int* dout = Device(std::vector<int>(64, 0));
  EXPECT_EQ(Launch(DivergentBarriers, 1, 64, 0, nullptr, dout), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a launch error is not sticky";
  EXPECT_EQ(Launch(BarrierAgainstShuffle, 1, 32, 0, nullptr, dout), cudaErrorLaunchFailure);
  cudaGetLastError();
  // The emulator goes on: the next launch runs, and a barrier after whole warps exited is met.
  ASSERT_EQ(Launch(AddOne, 1, 64, 0, nullptr, dout), cudaSuccess);
  EXPECT_EQ(Host(dout, 64)[0], 1) << "thread 0 never wrote (it waited at its barrier)";
  ASSERT_EQ(Launch(EarlyExitThenBarrier, 1, 64, 0, nullptr, dout), cudaSuccess);
  const std::vector<int> out = Host(dout, 64);
  for (int t = 0; t < 32; ++t) EXPECT_EQ(out[t], 31 - t) << t;
  cudaFree(dout);
}

TEST(CudaEmulatorTest, ShufflesNamingExitedOrUnmaskedLanesFail) {
  int* dout = Device(std::vector<int>(32, 0));
  EXPECT_EQ(Launch(ShuffleWithExitedLanes, 1, 32, 0, nullptr, dout), cudaErrorLaunchFailure);
  EXPECT_EQ(Launch(ShuffleOutsideMask, 1, 32, 0, nullptr, dout), cudaErrorLaunchFailure);
  cudaGetLastError();
  cudaFree(dout);
}

TEST(CudaEmulatorTest, LaunchLimitsAreTheDevicesOwn) {
  unsigned* dout = Device(std::vector<unsigned>(1 + 1024, 0));
  EXPECT_EQ(Launch(SharedScratch, 1, 1025, 0, nullptr, dout), cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch(SharedScratch, 0, 32, 0, nullptr, dout), cudaErrorInvalidConfiguration);
  // Beyond 48 KiB of dynamic shared memory only after cudaFuncSetAttribute asks for it.
  EXPECT_EQ(Launch(SharedScratch, 1, 128, 64 << 10, nullptr, dout), cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_EQ(
      cudaFuncSetAttribute(SharedScratch, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10),
      cudaSuccess);
  ASSERT_EQ(Launch(SharedScratch, 1, 128, 64 << 10, nullptr, dout), cudaSuccess);
  const std::vector<unsigned> out = Host(dout, 1 + 128);
  EXPECT_EQ(out[0], 0xffffffffu) << "dynamic shared memory starts as 0xff bytes";
  for (unsigned t = 0; t < 128; ++t) EXPECT_EQ(out[1 + t], (127 - t) * 3) << t;
  cudaFree(dout);
}

TEST(CudaEmulatorTest, GraphsReplayWhatTheCaptureRecorded) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  int* d = Device(std::vector<int>(32, 0));
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(Launch(AddOne, 1, 32, 0, stream, d), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(Host(d, 1)[0], 0) << "captured work does not run";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(Host(d, 32), std::vector<int>(32, 3));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  // Allocating or synchronising inside a capture invalidates it.
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  cudaFree(d);
  cudaStreamDestroy(stream);
}

TEST(CudaEmulatorTest, TheThreadOrderExposesAMissingBarrier) {
  int* dout = Device(std::vector<int>(1, 0));
  // After the barrier, which of thread 0's read and the last thread's write runs first depends on
  // the order (the last thread to arrive at a barrier runs on first): the two orders disagree.
  ASSERT_TRUE(tandem_emu::SetSchedule("forward"));
  ASSERT_EQ(Launch(MissingBarrier, 1, 64, 0, nullptr, 42, dout), cudaSuccess);
  const int forward = Host(dout, 1)[0];
  ASSERT_TRUE(tandem_emu::SetSchedule("reverse"));
  ASSERT_EQ(Launch(MissingBarrier, 1, 64, 0, nullptr, 42, dout), cudaSuccess);
  const int reverse = Host(dout, 1)[0];
  EXPECT_EQ((std::set<int>{forward, reverse}), (std::set<int>{-1, 42}))
      << forward << " and " << reverse;
  ASSERT_TRUE(tandem_emu::SetSchedule("random"));
  std::set<int> seen;
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(Launch(MissingBarrier, 1, 64, 0, nullptr, 42, dout), cudaSuccess);
    seen.insert(Host(dout, 1)[0]);
  }
  EXPECT_EQ(seen, (std::set<int>{-1, 42})) << "a shuffled order takes both";
  EXPECT_FALSE(tandem_emu::SetSchedule("sideways"));
  ASSERT_TRUE(tandem_emu::SetSchedule("forward"));
  cudaFree(dout);
}

TEST(CudaEmulatorTest, BlocksRunInTheScheduleOrder) {
  const dim3 grid(3, 2, 2);
  const int n = 12;
  std::vector<int> linear(n);
  std::iota(linear.begin(), linear.end(), 0);
  std::vector<int> reversed(linear.rbegin(), linear.rend());
  const auto turns = [&](const char* schedule) {
    EXPECT_TRUE(tandem_emu::SetSchedule(schedule));
    unsigned* count = Device(std::vector<unsigned>(1, 0));
    int* out = Device(std::vector<int>(n, -1));
    EXPECT_EQ(Launch(BlockTurn, grid, 32, 0, nullptr, count, out), cudaSuccess);
    std::vector<int> got = Host(out, n);
    cudaFree(count);
    cudaFree(out);
    return got;
  };
  EXPECT_EQ(turns("forward"), linear) << "x fastest, then y, then z";
  EXPECT_EQ(turns("reverse"), reversed);
  std::set<std::vector<int>> seen;
  for (int i = 0; i < 8; ++i) {
    std::vector<int> t = turns("random");
    std::vector<int> sorted = t;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, linear) << "every block once";
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 1u) << "a new order each launch";
  ASSERT_TRUE(tandem_emu::SetSchedule("forward"));
}

// Deferred streams: a copy on a non-blocking stream is not ordered after a kernel on the legacy
// stream (it sees the old bytes until the device is synchronised); on a blocking stream it is; a
// launch's failure comes back from the synchronisation.
TEST(CudaEmulatorTest, DeferredStreamsShowAMissingSynchronisation) {
  ASSERT_FALSE(tandem_emu::SetStreams("lazy"));
  ASSERT_TRUE(tandem_emu::SetStreams("deferred"));
  int* d = Device(std::vector<int>(32, 1));
  cudaStream_t non_blocking = nullptr, blocking = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  std::vector<int> out(32, 0);
  ASSERT_EQ(Launch(AddOne, 1, 32, 0, nullptr, d), cudaSuccess);  // queued on the legacy stream
  ASSERT_EQ(cudaMemcpyAsync(out.data(), d, 32 * sizeof(int), cudaMemcpyDeviceToHost, non_blocking),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(non_blocking), cudaSuccess);
  EXPECT_EQ(out, std::vector<int>(32, 1)) << "not ordered after the legacy stream's kernel";
  ASSERT_EQ(cudaMemcpyAsync(out.data(), d, 32 * sizeof(int), cudaMemcpyDeviceToHost, blocking),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(blocking), cudaSuccess);
  EXPECT_EQ(out, std::vector<int>(32, 2)) << "a blocking stream waits for the legacy stream";
  ASSERT_EQ(Launch(AddOne, 1, 32, 0, non_blocking, d), cudaSuccess);
  EXPECT_EQ(Host(d, 32), std::vector<int>(32, 2))
      << "cudaMemcpy does not wait for a non-blocking stream";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(Host(d, 32), std::vector<int>(32, 3));
  int* dout = Device(std::vector<int>(64, 0));
  ASSERT_EQ(Launch(DivergentBarriers, 1, 64, 0, non_blocking, dout), cudaSuccess)
      << "the failure comes later";
  EXPECT_EQ(cudaStreamSynchronize(non_blocking), cudaErrorLaunchFailure);
  cudaGetLastError();
  ASSERT_TRUE(tandem_emu::SetStreams("eager"));
  EXPECT_EQ(cudaStreamDestroy(non_blocking), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(dout), cudaSuccess);
}

TEST(CudaEmulatorTest, MemoryIsAccountedAndBounded) {
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1000), cudaSuccess);
  size_t free_after = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(free_before - free_after, 1024u) << "allocations are rounded to 256 bytes";
  void* huge = nullptr;
  EXPECT_EQ(cudaMalloc(&huge, total), cudaErrorMemoryAllocation);
  cudaGetLastError();
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue) << "a double free is refused";
  cudaGetLastError();
}

// Async work (emu/async_work.h, what the emulated NCCL's sends and receives are): the stream is
// held until the op completes, its later work waits behind it, events recorded after it are not
// ready, and the host's waits block; the enqueuing thread itself is never blocked. In both stream
// modes.
TEST(CudaEmulatorTest, AsyncWorkHoldsItsStreamUntilItCompletes) {
  for (const char* mode : {"eager", "deferred"}) {
    SCOPED_TRACE(mode);
    ASSERT_TRUE(tandem_emu::SetStreams(mode));
    int* d = Device(std::vector<int>(32, 0));
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cudaEvent_t before = nullptr, after = nullptr;
    ASSERT_EQ(cudaEventCreate(&before), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&after), cudaSuccess);
    ASSERT_EQ(Launch(AddOne, 1, 32, 0, s, d), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(before, s), cudaSuccess);
    auto op = std::make_shared<tandem_emu::AsyncOp>();
    std::vector<int> seen_at_start;
    ASSERT_EQ(tandem_emu::EnqueueAsync(s,
                                       [&] {
                                         seen_at_start.assign(
                                             d, d + 32);  // (device memory is host memory here)
                                         return op;
                                       }),
              cudaSuccess);
    EXPECT_EQ(seen_at_start, std::vector<int>(32, 1))
        << "the op starts after the work queued before it";
    ASSERT_EQ(Launch(AddOne, 1, 32, 0, s, d), cudaSuccess);  // behind the op
    ASSERT_EQ(cudaEventRecord(after, s), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(before), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(after), cudaErrorNotReady);
    EXPECT_EQ(Host(d, 32), std::vector<int>(32, 1)) << "work behind an op in flight ran";
    // A host wait blocks until the op completes (here, from another thread 50 ms later).
    const auto t0 = std::chrono::steady_clock::now();
    std::thread completer([op] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      op->Complete();
    });
    EXPECT_EQ(cudaEventSynchronize(after), cudaSuccess);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(45));
    completer.join();
    EXPECT_EQ(cudaEventQuery(after), cudaSuccess);
    EXPECT_EQ(Host(d, 32), std::vector<int>(32, 2));
    // Completed before anything waits: the work behind it runs at the next look at the stream.
    auto quick = std::make_shared<tandem_emu::AsyncOp>();
    ASSERT_EQ(tandem_emu::EnqueueAsync(s, [quick] { return quick; }), cudaSuccess);
    void* scratch = nullptr;
    ASSERT_EQ(cudaMallocAsync(&scratch, 64, s), cudaSuccess);
    size_t free_held = 0, total = 0, free_now = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_held, &total), cudaSuccess);
    ASSERT_EQ(cudaFreeAsync(scratch, s), cudaSuccess);  // behind the op
    ASSERT_EQ(cudaMemGetInfo(&free_now, &total), cudaSuccess);
    EXPECT_EQ(free_now, free_held)
        << "a stream-ordered free ran before the op it follows completed";
    quick->Complete();
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(cudaMemGetInfo(&free_now, &total), cudaSuccess);
    EXPECT_EQ(free_now, free_held + 256);
    // Never inside a capture.
    cudaStream_t capturing = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_EQ(
        tandem_emu::EnqueueAsync(capturing, [] { return std::make_shared<tandem_emu::AsyncOp>(); }),
        cudaErrorStreamCaptureUnsupported);
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(capturing, &graph), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    EXPECT_EQ(cudaStreamDestroy(capturing), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(before), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(after), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
    EXPECT_EQ(cudaFree(d), cudaSuccess);
  }
  ASSERT_TRUE(tandem_emu::SetStreams("eager"));
}

}  // namespace
}  // namespace tandem::cuda
