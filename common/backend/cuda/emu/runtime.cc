// The CUDA emulator's runtime (cuda_emu.h): launches run as fibers on the calling thread, device memory
// is host memory, and the CUDA runtime and cuBLAS calls this project makes are implemented here,
// with the device's rules where breaking them is a bug of ours (a launch's limits, allocation or a
// synchronisation inside a graph capture, an event timed before it was recorded).
//
// One launch runs at a time in the process (a global lock): __shared__ variables are function
// statics, and a block's fibers are the emulator's state.
#include <cublas_v2.h>
#include <pthread.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/backend/cuda/emu/async_work.h"
#include "common/backend/cuda/emu/cuda_emu.h"
#include "common/backend/cuda/emu/counters.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// The opaque handles of the runtime and cuBLAS.
struct CUstream_st {
  bool blocking = true;  // (cudaStreamNonBlocking: not ordered with the legacy default stream)
  bool capturing = false;
  bool capture_invalidated = false;
  std::thread::id capturer;
  std::vector<std::function<cudaError_t()>> recorded;
  // Async work (async_work.h), under async_mu: the op holding the stream, the work waiting behind
  // it, and whether a thread is running that work now.
  std::shared_ptr<tandem_emu::AsyncOp> in_flight;
  std::deque<std::function<cudaError_t()>> behind;
  bool draining = false;
};
struct CUevent_st {
  cudaStream_t stream = nullptr;  // where it was last recorded
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
  std::atomic<int> unrun{0};  // records enqueued (outside captures) whose work has not run yet
};
struct CUgraph_st {
  std::vector<std::function<cudaError_t()>> work;
};
struct CUgraphExec_st {
  std::vector<std::function<cudaError_t()>> work;
};
struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace tandem_emu {

ThreadState* current = nullptr;

namespace {

// The emulated device: an sm_90 with the H100's per-block limits.
constexpr int kMaxThreads = 1024;
constexpr int kMultiProcessors = 8;
constexpr int kComputeMajor = 9, kComputeMinor = 0;
constexpr size_t kDefaultSharedLimit = 48 << 10;
constexpr size_t kMaxSharedOptIn = 227 << 10;  // sm_90's per-block opt-in limit
constexpr size_t kStackBytes = 256 << 10;  // a fiber's stack, above a guard page

// A fiber's saved context and the switch between two (x86-64: the callee-saved registers, MXCSR and
// the x87 control word on the fiber's own stack, tens of nanoseconds; elsewhere ucontext, whose
// swapcontext makes a system call).
// Under AddressSanitizer each switch tells it which stack is about to run (its fiber interface), so
// that it checks accesses against the right one.
#if defined(__x86_64__) && !defined(TANDEM_CUDA_EMU_UCONTEXT)  // (the define: the portable path, for testing it)
struct Context {
  void* sp = nullptr;
  const void* stack = nullptr;  // the lowest address of the stack it runs on, and its size
  size_t stack_bytes = 0;
};
extern "C" void tandem_emu_switch(void** save_sp, void* next_sp);
asm(R"(
  .text
  .globl tandem_emu_switch
  .type tandem_emu_switch, @function
tandem_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tandem_emu_switch, .-tandem_emu_switch
)");
void RawSwitch(Context* save, Context* next) { tandem_emu_switch(&save->sp, next->sp); }
// A context that starts `entry` (which never returns) on the stack ending at `top`.
void MakeContext(Context* c, unsigned char* stack, size_t bytes, void (*entry)()) {
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15));
  top[-1] = 0;                                   // entry's return address: it never returns
  top[-2] = reinterpret_cast<uint64_t>(entry);  // where the switch's ret goes
  for (int r = 3; r <= 8; ++r) top[-r] = 0;      // rbp, rbx, r12..r15
  top[-9] = 0x1f80 | (uint64_t(0x037f) << 32);   // MXCSR and the x87 control word at their defaults
  c->sp = top - 9;
  c->stack = stack;
  c->stack_bytes = bytes;
}
#else
struct Context {
  ucontext_t uc;
  const void* stack = nullptr;
  size_t stack_bytes = 0;
};
void RawSwitch(Context* save, Context* next) { swapcontext(&save->uc, &next->uc); }
void MakeContext(Context* c, unsigned char* stack, size_t bytes, void (*entry)()) {
  c->stack = stack;
  c->stack_bytes = bytes;
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif

#if defined(__SANITIZE_ADDRESS__)
void SwitchTo(Context* save, Context* next) {
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, next->stack, next->stack_bytes);
  RawSwitch(save, next);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
}
// First thing on a fiber's stack: the switch that started it did not return through SwitchTo.
void FiberStarted() { __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr); }
// The scheduler's context is the launching thread's own stack.
void SetThreadStack(Context* c) {
  static thread_local std::pair<const void*, size_t> mine = [] {
    pthread_attr_t attr;
    void* addr = nullptr;
    size_t bytes = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      pthread_attr_getstack(&attr, &addr, &bytes);
      pthread_attr_destroy(&attr);
    }
    return std::pair<const void*, size_t>(addr, bytes);
  }();
  c->stack = mine.first;
  c->stack_bytes = mine.second;
}
#else
void SwitchTo(Context* save, Context* next) { RawSwitch(save, next); }
void FiberStarted() {}
void SetThreadStack(Context*) {}
#endif

struct Fiber {
  enum Status { kReady, kAtSync, kAtWarpOp, kDone };
  Context context;
  ThreadState state;
  unsigned char* stack = nullptr;
  Status status = kReady;
  unsigned mask = 0;
  uint64_t value = 0;
  const char* sync_file = nullptr;  // the __syncthreads it waits at
  int sync_line = 0;
  int turn = 0;  // its place in the block's run order
};

// The running block (one at a time in the process). Barriers release eagerly: the last thread to
// arrive releases the others and runs on; a waiting thread switches straight to the next thread that
// can run, and to the scheduler only at the end of the block's list (which starts a new round).
struct Block {
  std::vector<Fiber> fibers;
  int count = 0;
  int done = 0;
  int at_sync = 0;
  Context scheduler;
  Fiber* running = nullptr;
  const std::function<void()>* body = nullptr;
  std::unique_ptr<unsigned char[]> dynamic_shared;  // exactly the launch's bytes (so ASan sees overruns)
  std::vector<std::array<uint64_t, 32>> released;  // by warp: the values of its last released warp op
  // By warp: its warp ops some lanes wait at, one per mask (masks of one warp's pending ops are
  // disjoint: lanes apart may exchange in groups of their own).
  struct PendingOp {
    unsigned mask;
    int lanes;    // in the mask
    int arrived;  // so far
  };
  std::vector<std::vector<PendingOp>> pending;
  std::string fault;                               // set: the block stops, the launch fails
  // The order threads run in between barriers (OrderThreads()): by index, reversed, or shuffled.
  std::vector<Fiber*> order;
};
Block block;
std::mutex launch_mu;  // one launch at a time
std::mutex state_mu;   // streams, memory accounting, attributes
std::map<const void*, int> max_dynamic_shared;  // cudaFuncSetAttribute, by kernel
size_t allocated_bytes = 0;
std::map<void*, size_t> allocations;
thread_local cudaError_t last_error = cudaSuccess;
thread_local CUstream_st* thread_capture = nullptr;  // the stream this thread is capturing (thread-local mode)

size_t DeviceMemoryBytes() {
  static const size_t bytes = [] {
    const char* p = std::getenv("TANDEM_CUDA_EMU_MEMORY_MB");
    return (p != nullptr ? std::strtoull(p, nullptr, 10) : 4096ull) << 20;
  }();
  return bytes;
}

unsigned char* NewStack() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("CUDA emulator: mmap of a fiber stack");
    std::abort();
  }
  mprotect(p, page, PROT_NONE);  // an overflow faults instead of corrupting a neighbour
  return static_cast<unsigned char*>(p) + page;
}

// Runs `next` (set as the running thread) and saves the caller's context in `save`.
void RunFiber(Context* save, Fiber* next) {
  block.running = next;
  current = &next->state;
  SwitchTo(save, &next->context);
}

// The calling thread waits (its status says for what): on to the next thread of the block that can
// run, or back to the scheduler.
void Yield() {
  Fiber* self = block.running;
  for (int t = self->turn + 1; t < block.count; ++t) {
    if (block.order[t]->status == Fiber::kReady) return RunFiber(&self->context, block.order[t]);
  }
  SwitchTo(&self->context, &block.scheduler);
}

// TANDEM_CUDA_EMU_SCHEDULE: "forward" (the default: by index), "reverse", or "random" (a
// new order every block, seeded by TANDEM_CUDA_EMU_SEED). Which thread runs first between two
// barriers is all a missing barrier can depend on here, so running a test in each order exposes
// reads of shared or global memory that another thread writes without a barrier between. A grid's
// blocks run in the same kind of order (which one is last is all a kernel's "the last block to finish"
// can depend on here).
enum class Schedule { kForward, kReverse, kRandom };
std::optional<Schedule> ParseSchedule(const std::string& v) {
  if (v == "forward") return Schedule::kForward;
  if (v == "reverse") return Schedule::kReverse;
  if (v == "random") return Schedule::kRandom;
  return std::nullopt;
}
std::optional<Schedule> schedule_override;  // SetSchedule (guarded by launch_mu)
Schedule CurrentSchedule() {
  static const Schedule from_env = [] {
    const char* p = std::getenv("TANDEM_CUDA_EMU_SCHEDULE");
    const std::optional<Schedule> s = ParseSchedule(p != nullptr ? p : "forward");
    if (!s) {
      std::fprintf(stderr, "CUDA emulator: TANDEM_CUDA_EMU_SCHEDULE must be forward, reverse or random, not '%s'\n", p);
      std::abort();
    }
    return *s;
  }();
  return schedule_override.value_or(from_env);
}

std::mt19937& ScheduleRng() {
  static std::mt19937 rng([] {
    const char* p = std::getenv("TANDEM_CUDA_EMU_SEED");
    return p != nullptr ? static_cast<uint32_t>(std::strtoul(p, nullptr, 10)) : 1u;
  }());
  return rng;
}

// `items` put in the schedule's order.
template <typename T>
void Order(std::vector<T>& items) {
  switch (CurrentSchedule()) {
    case Schedule::kForward: break;
    case Schedule::kReverse: std::reverse(items.begin(), items.end()); break;
    case Schedule::kRandom: std::shuffle(items.begin(), items.end(), ScheduleRng()); break;
  }
}

void OrderThreads() {
  block.order.resize(block.count);
  for (int i = 0; i < block.count; ++i) block.order[i] = &block.fibers[i];
  Order(block.order);
  for (int t = 0; t < block.count; ++t) block.order[t]->turn = t;
}

std::string Where(const Fiber& f) {
  char s[160];
  std::snprintf(s, sizeof(s), "block (%u,%u,%u) thread (%u,%u,%u)", f.state.block_idx.x, f.state.block_idx.y,
                f.state.block_idx.z, f.state.thread_idx.x, f.state.thread_idx.y, f.state.thread_idx.z);
  return s;
}

// __syncthreads completes once every thread still running has arrived (threads that exited do not
// hold it, as on the device), all at the same one; threads at different ones are a fault.
void MaybeReleaseSync() {
  if (block.at_sync == 0 || block.at_sync + block.done != block.count) return;
  const Fiber* first = nullptr;
  for (int i = 0; i < block.count; ++i) {
    const Fiber& f = block.fibers[i];
    if (f.status != Fiber::kAtSync) continue;
    if (first == nullptr) {
      first = &f;
    } else if (f.sync_line != first->sync_line || std::strcmp(f.sync_file, first->sync_file) != 0) {
      const std::string what = "threads wait at different __syncthreads: " + Where(*first) + " at " +
                               first->sync_file + ":" + std::to_string(first->sync_line) + ", " + Where(f) + " at " +
                               f.sync_file + ":" + std::to_string(f.sync_line);
      Fault(what.c_str());
    }
  }
  for (int i = 0; i < block.count; ++i) {
    if (block.fibers[i].status == Fiber::kAtSync) block.fibers[i].status = Fiber::kReady;
  }
  block.at_sync = 0;
}

[[noreturn]] void FiberMain() {
  FiberStarted();
  (*block.body)();
  block.running->status = Fiber::kDone;
  ++block.done;
  MaybeReleaseSync();
  Yield();  // never resumed
  std::abort();
}

// Thread i of the block at `block_idx`, ready to run from the kernel's first instruction.
void StartFiber(int i, dim3 grid, dim3 threads, uint3 block_idx) {
  Fiber& f = block.fibers[i];
  if (f.stack == nullptr) f.stack = NewStack();
  f.state.thread_idx = {unsigned(i) % threads.x, (unsigned(i) / threads.x) % threads.y,
                        unsigned(i) / (threads.x * threads.y)};
  f.state.block_idx = block_idx;
  f.state.block_dim = threads;
  f.state.grid_dim = grid;
  f.state.lane = i % 32;
  f.state.warp = i / 32;
  f.status = Fiber::kReady;
  MakeContext(&f.context, f.stack, kStackBytes, FiberMain);
}

// Why no thread of a stuck block can run.
std::string Deadlock() {
  for (int i = 0; i < block.count; ++i) {
    const Fiber& f = block.fibers[i];
    if (f.status != Fiber::kAtWarpOp) continue;
    const int first = f.state.warp * 32;
    for (int m = 0; m < 32; ++m) {
      if (((f.mask >> m) & 1u) == 0) continue;
      if (first + m >= block.count || block.fibers[first + m].status == Fiber::kDone) {
        return "a warp op's mask names lane " + std::to_string(m) + ", which has exited or does not exist (" +
               Where(f) + ")";
      }
    }
  }
  std::string who;
  for (int i = 0; i < block.count && who.size() < 400; ++i) {
    const Fiber& f = block.fibers[i];
    if (f.status == Fiber::kDone) continue;
    if (i > 0 && f.status == block.fibers[i - 1].status && i % 32 != 0) continue;
    who += " " + Where(f) + (f.status == Fiber::kAtSync ? " at __syncthreads;" : " at a warp op;");
  }
  return "deadlock: threads wait at barriers the others never reach:" + who;
}

// Runs the block's threads to completion; false (block.fault says why) on a fault or a deadlock.
bool RunBlock() {
  for (;;) {
    bool ran = false;
    for (int t = 0; t < block.count; ++t) {
      if (block.order[t]->status != Fiber::kReady) continue;
      ran = true;
      RunFiber(&block.scheduler, block.order[t]);
      current = nullptr;
      if (!block.fault.empty()) return false;
    }
    if (block.done == block.count) return true;
    if (!ran) {
      block.fault = Deadlock();
      return false;
    }
  }
}

// The name and text of each error the emulator returns (the runtime's own texts).
struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
const ErrorText& Describe(cudaError_t e) {
  static const ErrorText kTexts[] = {
      {cudaSuccess, "cudaSuccess", "no error"},
      {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
      {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
      {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
      {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
      {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure (the emulator printed why)"},
      {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
       "operation not permitted when stream is capturing"},
      {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
       "operation failed due to a previous error during capture"},
      {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
      {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
  };
  static const ErrorText kUnknown = {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"};
  for (const ErrorText& t : kTexts) {
    if (t.code == e) return t;
  }
  return kUnknown;
}

std::atomic<uint64_t> kernels_run{0};

cudaError_t SetLast(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

// Stream order (TANDEM_CUDA_EMU_STREAMS): "eager" (the default) runs work when it is enqueued;
// "deferred" queues it on its stream until a synchronisation needs it, so that a read on one stream
// of what another wrote without synchronising sees the old bytes, as it may on the device. Queues run
// in enqueue order within a stream; the legacy default stream (nullptr) and blocking streams wait for
// each other's earlier work; non-blocking streams wait for nothing. Errors of queued work are reported
// by the synchronisation that runs it.
struct Pending {
  uint64_t seq;
  std::function<cudaError_t()> work;
};
std::mutex queue_mu;    // the queues below
std::mutex flush_mu;    // one flush at a time: a stream's work never runs on two threads at once
uint64_t next_seq = 0;
std::map<cudaStream_t, std::deque<Pending>> queues;  // nullptr: the legacy stream

std::atomic<int> deferred_mode{-1};  // -1: not read from the environment yet
bool Deferred() {
  int mode = deferred_mode.load();
  if (mode < 0) {
    const char* p = std::getenv("TANDEM_CUDA_EMU_STREAMS");
    const std::string v = p != nullptr ? p : "eager";
    if (v != "eager" && v != "deferred") {
      std::fprintf(stderr, "CUDA emulator: TANDEM_CUDA_EMU_STREAMS must be eager or deferred, not '%s'\n", p);
      std::abort();
    }
    int expected = -1;
    deferred_mode.compare_exchange_strong(expected, v == "deferred" ? 1 : 0);
    mode = deferred_mode.load();
  }
  return mode == 1;
}

// The queue whose front must run next for `target`'s front to run (queue_mu held): a blocking or
// legacy item waits for earlier items of the other kind.
std::deque<Pending>* NextFor(cudaStream_t target) {
  auto& q = queues[target];
  if (q.empty()) return nullptr;
  const bool legacy = target == nullptr;
  if (!legacy && !target->blocking) return &q;
  std::deque<Pending>* best = &q;
  for (auto& [stream, other] : queues) {
    if (other.empty() || stream == target || other.front().seq > best->front().seq) continue;
    // legacy waits for blocking streams, blocking streams for legacy
    if (legacy ? (stream != nullptr && stream->blocking) : stream == nullptr) best = &other;
  }
  if (best != &q && !legacy && best == &queues[nullptr]) {
    std::deque<Pending>* first = NextFor(nullptr);  // the legacy item's own predecessors
    if (first != nullptr) best = first;
  }
  return best;
}

// Runs queued work until `target`'s queue is empty (all queues when `all`), in order; the first error.
cudaError_t Flush(cudaStream_t target, bool all) {
  if (!Deferred()) return cudaSuccess;
  std::lock_guard<std::mutex> flushing(flush_mu);
  cudaError_t first = cudaSuccess;
  while (true) {
    Pending item;
    {
      std::lock_guard<std::mutex> lock(queue_mu);
      std::deque<Pending>* from = nullptr;
      if (all) {
        for (auto& [stream, q] : queues) {
          if (!q.empty() && (from == nullptr || q.front().seq < from->front().seq)) from = &q;
        }
      } else {
        from = NextFor(target);
      }
      if (from == nullptr) break;
      item = std::move(from->front());
      from->pop_front();
    }
    const cudaError_t e = item.work();
    if (first == cudaSuccess) first = e;
  }
  return first;
}

// Async work (async_work.h). A stream whose op is in flight keeps the work it gets meanwhile in
// `behind`; whichever thread next looks at the stream after the op completed runs that work, in order,
// up to the next op. (A stream's work is enqueued by one thread at a time in this project; two
// threads enqueueing on one stream at once could reorder work that was not behind an op.)
std::mutex async_mu;
std::set<cudaStream_t> async_streams;  // streams that have had async work (device-wide waits)

// Runs the work behind `stream`'s completed op, up to the next op in flight.
void Drain(cudaStream_t stream) {
  if (stream == nullptr) return;
  while (true) {
    std::function<cudaError_t()> item;
    {
      std::lock_guard<std::mutex> lock(async_mu);
      if (stream->draining) return;  // another thread is running it
      if (stream->in_flight != nullptr) {
        if (!stream->in_flight->done()) return;
        stream->in_flight.reset();
      }
      if (stream->behind.empty()) return;
      item = std::move(stream->behind.front());
      stream->behind.pop_front();
      stream->draining = true;
    }
    const cudaError_t e = item();  // an async op's start sets in_flight again
    {
      std::lock_guard<std::mutex> lock(async_mu);
      stream->draining = false;
    }
    if (e != cudaSuccess) last_error = e;
  }
}

// Queues `work` behind `stream`'s op in flight (or the work already waiting there), if any: true.
bool QueuedBehind(cudaStream_t stream, std::function<cudaError_t()>& work) {
  if (stream == nullptr) return false;
  Drain(stream);
  std::lock_guard<std::mutex> lock(async_mu);
  if (stream->in_flight == nullptr && stream->behind.empty() && !stream->draining) return false;
  stream->behind.push_back(std::move(work));
  return true;
}

// Runs `work` now, or queues it behind `stream`'s async work.
cudaError_t RunOrQueueBehind(cudaStream_t stream, std::function<cudaError_t()> work) {
  return QueuedBehind(stream, work) ? cudaSuccess : work();
}

// Blocks until `done()` (asked under async_mu), running the work behind `stream`'s async ops as they
// complete.
void WaitUntil(cudaStream_t stream, const std::function<bool()>& done) {
  while (true) {
    Drain(stream);
    std::shared_ptr<AsyncOp> op;
    {
      std::lock_guard<std::mutex> lock(async_mu);
      if (done()) return;
      if (stream != nullptr) op = stream->in_flight;
    }
    if (op != nullptr) {
      op->Wait();
    } else {
      std::this_thread::yield();  // another thread runs the work behind it
    }
  }
}

// Blocks until `stream` holds no async work and nothing waits behind it.
void WaitAsync(cudaStream_t stream) {
  if (stream == nullptr) return;
  WaitUntil(stream, [stream] { return stream->in_flight == nullptr && stream->behind.empty() && !stream->draining; });
}

// Blocks until every stream that had async work holds none.
void WaitAllAsync() {
  std::vector<cudaStream_t> streams;
  {
    std::lock_guard<std::mutex> lock(async_mu);
    streams.assign(async_streams.begin(), async_streams.end());
  }
  for (cudaStream_t s : streams) WaitAsync(s);
}

// Blocks until `event`'s records have run (the deferred queues already flushed up to them).
void WaitEvent(cudaEvent_t event) {
  if (event->unrun.load() == 0) return;
  WaitUntil(event->stream, [event] { return event->unrun.load() == 0; });
}

// Work for `stream`: recorded when it is being captured, else run now or queued (Deferred()); behind
// an async op in flight on it, queued there.
cudaError_t Enqueue(cudaStream_t stream, std::function<cudaError_t()> work) {
  if (stream != nullptr && stream->capturing && stream->capturer == std::this_thread::get_id()) {
    stream->recorded.push_back(std::move(work));
    return cudaSuccess;
  }
  if (!Deferred()) return RunOrQueueBehind(stream, std::move(work));
  if (QueuedBehind(stream, work)) return cudaSuccess;
  std::lock_guard<std::mutex> lock(queue_mu);
  queues[stream].push_back({next_seq++, std::move(work)});
  return cudaSuccess;
}

// A call that the device refuses while this thread captures a graph (allocation, synchronisation):
// the capture is invalidated, as the device does.
bool RefusedInCapture() {
  if (thread_capture == nullptr) return false;
  thread_capture->capture_invalidated = true;
  last_error = cudaErrorStreamCaptureUnsupported;
  return true;
}

}  // namespace

void SyncThreads(const char* file, int line) {
  block.running->status = Fiber::kAtSync;
  block.running->sync_file = file;
  block.running->sync_line = line;
  ++block.at_sync;
  MaybeReleaseSync();
  if (block.running->status != Fiber::kReady) Yield();
}

const uint64_t* WarpExchange(unsigned mask, uint64_t value) {
  Fiber& f = *block.running;
  const int w = f.state.warp;
  if (((mask >> f.state.lane) & 1u) == 0) Fault("a warp op whose mask leaves out its own lane");
  auto& pending = block.pending[w];
  auto op = pending.begin();
  for (; op != pending.end() && op->mask != mask; ++op) {
    if ((op->mask & mask) != 0) Fault("lanes of one warp wait at warp ops with overlapping masks");
  }
  if (op == pending.end()) op = pending.insert(op, {mask, __builtin_popcount(mask), 0});
  f.status = Fiber::kAtWarpOp;
  f.value = value;
  f.mask = mask;
  if (++op->arrived == op->lanes) {  // the last lane: release the warp op
    pending.erase(op);
    Fiber* lanes = block.fibers.data() + w * 32;
    for (int m = 0; m < 32; ++m) {
      if (((mask >> m) & 1u) == 0) continue;
      block.released[w][m] = lanes[m].value;
      lanes[m].status = Fiber::kReady;
    }
  } else {
    Yield();
  }
  return block.released[w].data();
}

void Fault(const char* what) {
  block.fault = std::string(what) + " (in " + Where(*block.running) + ")";
  SwitchTo(&block.running->context, &block.scheduler);  // which abandons the block
  std::abort();
}

bool SetStreams(const char* name) {
  const std::string v = name;
  if (v != "eager" && v != "deferred") return false;
  Flush(nullptr, /*all=*/true);
  deferred_mode.store(v == "deferred" ? 1 : 0);
  return true;
}

uint64_t KernelsRun() { return kernels_run.load(std::memory_order_relaxed); }

cudaError_t EnqueueAsync(cudaStream_t stream, std::function<std::shared_ptr<AsyncOp>()> start) {
  if (stream == nullptr) return SetLast(cudaErrorInvalidResourceHandle);
  if (stream->capturing) {
    stream->capture_invalidated = true;
    return SetLast(cudaErrorStreamCaptureUnsupported);
  }
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  // Deferred: what the stream has queued runs first (the op reads or writes what it left).
  if (const cudaError_t e = Flush(stream, false); e != cudaSuccess) return SetLast(e);
  {
    std::lock_guard<std::mutex> lock(async_mu);
    async_streams.insert(stream);
  }
  return SetLast(RunOrQueueBehind(stream, [stream, start = std::move(start)]() -> cudaError_t {
    std::shared_ptr<AsyncOp> op = start();
    std::lock_guard<std::mutex> lock(async_mu);
    stream->in_flight = std::move(op);  // (null: it completed at once)
    return cudaSuccess;
  }));
}

unsigned char* DynamicShared() { return block.dynamic_shared.get(); }

bool SetSchedule(const char* name) {
  const std::optional<Schedule> s = ParseSchedule(name);
  if (!s) return false;
  std::lock_guard<std::mutex> lock(launch_mu);
  schedule_override = s;
  return true;
}

const char* KernelName(const char* launch_signature) {
  static std::mutex mu;
  static std::map<const char*, std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  std::string& name = names[launch_signature];
  if (name.empty()) {
    const std::string sig(launch_signature);
    const size_t begin = sig.find("Params = {");
    const size_t end = begin == std::string::npos ? std::string::npos : sig.find('}', begin);
    name = end == std::string::npos ? sig : "a kernel (" + sig.substr(begin + 10, end - begin - 10) + ")";
  }
  return name.c_str();
}

cudaError_t LaunchGrid(const void* kernel, const char* name, dim3 grid, dim3 threads, size_t shared_bytes,
                       cudaStream_t stream, std::function<void()> body) {
  const uint64_t per_block = uint64_t(threads.x) * threads.y * threads.z;
  if (per_block == 0 || per_block > kMaxThreads || threads.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) {
    std::fprintf(stderr, "CUDA emulator: bad launch configuration of %s: grid (%u,%u,%u), block (%u,%u,%u)\n", name,
                 grid.x, grid.y, grid.z, threads.x, threads.y, threads.z);
    return SetLast(cudaErrorInvalidConfiguration);
  }
  {
    std::lock_guard<std::mutex> lock(state_mu);
    const auto it = max_dynamic_shared.find(kernel);
    const size_t limit = it == max_dynamic_shared.end() ? kDefaultSharedLimit : size_t(it->second);
    if (shared_bytes > limit) {
      std::fprintf(stderr, "CUDA emulator: %s asks %zu bytes of dynamic shared memory, above its limit of %zu\n", name,
                   shared_bytes, limit);
      return SetLast(cudaErrorInvalidValue);
    }
  }
  return SetLast(Enqueue(stream, [name, grid, threads, shared_bytes, body = std::move(body), per_block]() -> cudaError_t {
    std::lock_guard<std::mutex> lock(launch_mu);
    kernels_run.fetch_add(1, std::memory_order_relaxed);
    const int count = static_cast<int>(per_block);
    if (block.fibers.size() < size_t(count)) block.fibers.resize(count);
    block.count = count;
    SetThreadStack(&block.scheduler);
    block.dynamic_shared.reset(shared_bytes > 0 ? new unsigned char[shared_bytes] : nullptr);
    block.body = &body;
    block.released.assign((count + 31) / 32, {});
    block.pending.assign((count + 31) / 32, {});  // a block that completes leaves every warp's list empty
    // Blocks by linear index (x fastest), in the schedule's order.
    const uint64_t total = uint64_t(grid.x) * grid.y * grid.z;
    std::vector<uint64_t> shuffled;
    if (CurrentSchedule() == Schedule::kRandom) {
      shuffled.resize(total);
      std::iota(shuffled.begin(), shuffled.end(), uint64_t{0});
      Order(shuffled);
    }
    for (uint64_t i = 0; i < total; ++i) {
      const uint64_t linear = !shuffled.empty() ? shuffled[i] : CurrentSchedule() == Schedule::kReverse ? total - 1 - i : i;
      const uint3 b{unsigned(linear % grid.x), unsigned(linear / grid.x % grid.y), unsigned(linear / grid.x / grid.y)};
      if (shared_bytes > 0) std::memset(block.dynamic_shared.get(), 0xff, shared_bytes);
      block.done = 0;
      block.at_sync = 0;
      for (int i = 0; i < count; ++i) StartFiber(i, grid, threads, b);
      OrderThreads();
      if (!RunBlock()) {
        std::fprintf(stderr, "CUDA emulator: %s: %s\n", name, block.fault.c_str());
        block.fault.clear();
        return cudaErrorLaunchFailure;
      }
    }
    return cudaSuccess;
  }));
}

}  // namespace tandem_emu

using tandem_emu::Enqueue;
using tandem_emu::RefusedInCapture;
using tandem_emu::SetLast;

// --- Devices, errors ---

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : SetLast(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return SetLast(cudaErrorInvalidDevice);
  *prop = {};
  std::snprintf(prop->name, sizeof(prop->name), "Tandem CUDA emulator");
  prop->totalGlobalMem = tandem_emu::DeviceMemoryBytes();
  prop->major = tandem_emu::kComputeMajor;
  prop->minor = tandem_emu::kComputeMinor;
  prop->multiProcessorCount = tandem_emu::kMultiProcessors;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = tandem_emu::kMaxThreads;
  prop->sharedMemPerBlock = tandem_emu::kDefaultSharedLimit;
  prop->sharedMemPerBlockOptin = tandem_emu::kMaxSharedOptIn;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return SetLast(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = tandem_emu::kMultiProcessors; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = tandem_emu::kComputeMajor; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = tandem_emu::kComputeMinor; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(tandem_emu::kMaxSharedOptIn); return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    default: return SetLast(cudaErrorInvalidValue);
  }
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = tandem_emu::last_error;
  tandem_emu::last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return tandem_emu::last_error; }
const char* cudaGetErrorName(cudaError_t e) { return tandem_emu::Describe(e).name; }
const char* cudaGetErrorString(cudaError_t e) { return tandem_emu::Describe(e).text; }
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || size_t(value) > tandem_emu::kMaxSharedOptIn) return SetLast(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(tandem_emu::state_mu);
  tandem_emu::max_dynamic_shared[func] = value;
  return cudaSuccess;
}

// --- Memory ---

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  std::lock_guard<std::mutex> lock(tandem_emu::state_mu);
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  if (tandem_emu::allocated_bytes + rounded > tandem_emu::DeviceMemoryBytes()) return SetLast(cudaErrorMemoryAllocation);
  *p = std::aligned_alloc(256, rounded);
  if (*p == nullptr) return SetLast(cudaErrorMemoryAllocation);
#if defined(__SANITIZE_ADDRESS__)
  // The device's allocations are 256-byte aligned; past the bytes asked for is still out of bounds.
  __asan_poison_memory_region(static_cast<char*>(*p) + bytes, rounded - bytes);
#endif
  tandem_emu::allocated_bytes += rounded;
  tandem_emu::allocations[*p] = rounded;
  return cudaSuccess;
}
}  // extern "C"

namespace tandem_emu {
namespace {

cudaError_t Release(void* p) {
  std::lock_guard<std::mutex> lock(state_mu);
  const auto it = allocations.find(p);
  if (it == allocations.end()) return cudaErrorInvalidValue;
  allocated_bytes -= it->second;
  [[maybe_unused]] const size_t rounded_size = it->second;
  allocations.erase(it);
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(p, rounded_size);
#endif
  std::free(p);
  return cudaSuccess;
}

}  // namespace
}  // namespace tandem_emu

extern "C" {

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  // As on the device, freeing waits for the work before it, async work included.
  tandem_emu::Flush(nullptr, /*all=*/true);
  tandem_emu::WaitAllAsync();
  return SetLast(tandem_emu::Release(p));
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (p == nullptr) return cudaSuccess;
  return SetLast(Enqueue(stream, [p] { return tandem_emu::Release(p); }));
}
// The stream-ordered allocator's pool is not modelled: a free releases its memory when it runs.
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int) {
  static int the_pool;
  *pool = reinterpret_cast<cudaMemPool_t>(&the_pool);
  return cudaSuccess;
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) { return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  std::lock_guard<std::mutex> lock(tandem_emu::state_mu);
  *total = tandem_emu::DeviceMemoryBytes();
  *free_bytes = *total - tandem_emu::allocated_bytes;
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (kind == cudaMemcpyHostToDevice && tandem_emu::Deferred() && !(stream != nullptr && stream->capturing)) {
    // From (pageable) host memory the device stages the bytes before the call returns: the caller may
    // reuse its buffer at once.
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + bytes);
    return SetLast(Enqueue(stream, [dst, staged] {
      if (!staged->empty()) std::memmove(dst, staged->data(), staged->size());
      return cudaSuccess;
    }));
  }
  return SetLast(Enqueue(stream, [dst, src, bytes] {
    if (bytes > 0) std::memmove(dst, src, bytes);
    return cudaSuccess;
  }));
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  if (const cudaError_t e = tandem_emu::Flush(nullptr, false); e != cudaSuccess) return SetLast(e);
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  return SetLast(Enqueue(stream, [p, value, bytes] {
    std::memset(p, value, bytes);
    return cudaSuccess;
  }));
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  if (const cudaError_t e = tandem_emu::Flush(nullptr, false); e != cudaSuccess) return SetLast(e);
  std::memset(p, value, bytes);
  return cudaSuccess;
}

// --- Streams, events, graphs ---

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  *stream = new CUstream_st;
  (*stream)->blocking = (flags & cudaStreamNonBlocking) == 0;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  const cudaError_t e = tandem_emu::Flush(stream, false);  // its work still completes
  tandem_emu::WaitAsync(stream);
  {
    std::lock_guard<std::mutex> lock(tandem_emu::queue_mu);
    tandem_emu::queues.erase(stream);
  }
  {
    std::lock_guard<std::mutex> lock(tandem_emu::async_mu);
    tandem_emu::async_streams.erase(stream);
  }
  delete stream;
  return SetLast(e);
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (stream != nullptr && stream->capturing) {
    stream->capture_invalidated = true;
    return SetLast(cudaErrorStreamCaptureUnsupported);
  }
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  const cudaError_t e = tandem_emu::Flush(stream, false);
  tandem_emu::WaitAsync(stream);
  return SetLast(e);
}
cudaError_t cudaDeviceSynchronize() {
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  const cudaError_t e = tandem_emu::Flush(nullptr, /*all=*/true);
  tandem_emu::WaitAllAsync();
  return SetLast(e);
}
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (stream == nullptr || stream->capturing) return SetLast(cudaErrorIllegalState);
  stream->capturing = true;
  stream->capture_invalidated = false;
  stream->capturer = std::this_thread::get_id();
  stream->recorded.clear();
  tandem_emu::thread_capture = stream;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  *graph = nullptr;
  if (stream == nullptr || !stream->capturing) return SetLast(cudaErrorIllegalState);
  stream->capturing = false;
  if (tandem_emu::thread_capture == stream) tandem_emu::thread_capture = nullptr;
  if (stream->capture_invalidated) {
    stream->recorded.clear();
    return SetLast(cudaErrorStreamCaptureInvalidated);
  }
  *graph = new CUgraph_st{std::move(stream->recorded)};
  stream->recorded.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  *status = stream != nullptr && stream->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return SetLast(cudaErrorInvalidResourceHandle);
  return SetLast(Enqueue(stream, [exec] {
    for (const auto& w : exec->work) {
      if (const cudaError_t e = w(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }));
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int /*flags: timing is always kept*/) {
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event->unrun.load() > 0) tandem_emu::Drain(event->stream);
  // A record still queued (deferred, or behind async work) refers to the event: as on the device, it
  // is destroyed once that work has run, here never (a leak of a few bytes, in tests).
  if (event->unrun.load() == 0) delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  event->stream = stream;
  // A record captured into a graph runs at each replay, counted by none.
  const bool counted = !(stream != nullptr && stream->capturing && stream->capturer == std::this_thread::get_id());
  if (counted) event->unrun.fetch_add(1);
  return SetLast(Enqueue(stream, [event, counted] {
    event->recorded = true;
    event->at = std::chrono::steady_clock::now();
    if (counted) event->unrun.fetch_sub(1);
    return cudaSuccess;
  }));
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  // Eager: recorded work has run (and an event never recorded has nothing to wait for), unless it
  // waits behind async work. Deferred: the event's stream is run to its end (a little more than up to
  // the event).
  const cudaError_t e = tandem_emu::Flush(event->stream, false);
  tandem_emu::WaitEvent(event);
  return SetLast(e);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int /*flags*/) {
  (void)stream;
  if (tandem_emu::thread_capture != nullptr) return cudaSuccess;  // (captured work runs at replay, in order)
  // Eager: the event's work has run, or this waits on the host for the async work it is behind.
  // Deferred: the event's stream runs to its end now, before anything `stream` queues after this (more
  // than the wait asks for, never less).
  const cudaError_t e = tandem_emu::Flush(event->stream, false);
  tandem_emu::WaitEvent(event);
  return SetLast(e);
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  // Complete once run: eager work has, unless it waits behind async work in flight; deferred work up
  // to the event runs now (as a synchronisation).
  const cudaError_t e = tandem_emu::Flush(event->stream, false);
  if (e != cudaSuccess) return SetLast(e);
  if (event->unrun.load() > 0) tandem_emu::Drain(event->stream);
  return event->unrun.load() > 0 ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start->recorded || !end->recorded) return SetLast(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}

}  // extern "C"

// --- cuBLAS: column-major GEMMs over f32 (16-bit inputs widened exactly) ---
// Each output is its own dot product in one fixed order (eight interleaved partial sums, then their
// sum), so a row's result never depends on the rows beside it or its place among them, as with
// cuBLAS on a fixed shape (the batch-invariant mode relies on it). OpenBLAS is not used: some of its
// kernels (Haswell's) round an output differently by its column's place in the tile.

namespace {

float Element(const void* p, cudaDataType type, int64_t i) {
  switch (type) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
    default: std::abort();
  }
}

// op(X)'s `vectors` vectors of `k` elements each, contiguous in f32: for A (m × k) its rows, for B
// (k × n) its columns. X is column-major with leading dimension ld; `by_column`: vector v is X's
// column v (else its row v).
std::vector<float> Vectors(const void* x, cudaDataType type, int64_t ld, int64_t vectors, int64_t k, bool by_column) {
  std::vector<float> out(vectors * k);
  for (int64_t v = 0; v < vectors; ++v) {
    for (int64_t p = 0; p < k; ++p) out[v * k + p] = Element(x, type, by_column ? v * ld + p : p * ld + v);
  }
  return out;
}

float Dot(const float* a, const float* b, int64_t k) {
  float lanes[8] = {};
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[p + l] * b[p + l];
  }
  for (; p < k; ++p) lanes[p % 8] += a[p] * b[p];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

bool Supported(cudaDataType type) { return type == CUDA_R_32F || type == CUDA_R_16BF || type == CUDA_R_16F; }

// C[m][n] (column-major, ldc) = alpha · op(A) · op(B) + beta · C.
cublasStatus_t Gemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                    const void* a, cudaDataType at, int lda, const void* b, cudaDataType bt, int ldb, float beta, void* c,
                    cudaDataType ct, int ldc) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || !Supported(at) || !Supported(bt) || ct != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
  if ((ta == CUBLAS_OP_N ? lda < std::max(1, m) : lda < std::max(1, k)) ||
      (tb == CUBLAS_OP_N ? ldb < std::max(1, k) : ldb < std::max(1, n)) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const cudaError_t e = Enqueue(handle->stream, [=] {
    // A's rows: with op T, A's stored columns; B's columns: with op N, its stored columns.
    const std::vector<float> rows = Vectors(a, at, lda, m, k, ta != CUBLAS_OP_N);
    const std::vector<float> cols = Vectors(b, bt, ldb, n, k, tb == CUBLAS_OP_N);
    float* out = static_cast<float*>(c);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        const float s = alpha * Dot(rows.data() + i * k, cols.data() + j * k, k);
        float& r = out[j * ldc + i];
        r = beta == 0.f ? s : s + beta * r;  // cuBLAS does not read C when beta is 0 (it may hold NaN)
      }
    }
    return cudaSuccess;
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float* alpha, const float* a, int lda, const float* b, int ldb, const float* beta,
                              float* c, int ldc) {
  return Gemm(handle, ta, tb, m, n, k, *alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, *beta, c, CUDA_R_32F, ldc);
}
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* a, cudaDataType at, int lda, const void* b, cudaDataType bt,
                            int ldb, const void* beta, void* c, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC) return CUBLAS_STATUS_NOT_SUPPORTED;
  return Gemm(handle, ta, tb, m, n, k, *static_cast<const float*>(alpha), a, at, lda, b, bt, ldb,
              *static_cast<const float*>(beta), c, ct, ldc);
}

}  // extern "C"
