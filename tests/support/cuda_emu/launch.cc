// The CUDA emulator's launches (cuda_emu.h): a kernel's blocks run one after another on the thread
// that runs its stream's work, each of a block's threads a fiber (its own stack) switched at
// barriers and warp ops, in the schedule's order; what the device would refuse or leave undefined
// (a barrier some threads never reach, a shuffle outside its mask, launch limits) fails the launch,
// naming the kernel, block and thread.
//
// One launch runs at a time in the process (a global lock): __shared__ variables are function
// statics, and a block's fibers are the emulator's state.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tests/support/cuda_emu/counters.h"
#include "tests/support/cuda_emu/cuda_emu.h"
#include "tests/support/cuda_emu/runtime_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace tandem_emu {

ThreadState* current = nullptr;
std::map<const void*, int> max_dynamic_shared;

namespace {

constexpr size_t kStackBytes = 256 << 10;  // a fiber's stack, above a guard page

// A fiber's saved context and the switch between two (x86-64: the callee-saved registers, MXCSR and
// the x87 control word on the fiber's own stack, tens of nanoseconds; elsewhere ucontext, whose
// swapcontext makes a system call).
// Under AddressSanitizer each switch tells it which stack is about to run (its fiber interface), so
// that it checks accesses against the right one.
#if defined(__x86_64__) && \
    !defined(TANDEM_CUDA_EMU_UCONTEXT)  // (the define: the portable path, for testing it)
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
  auto* top =
      reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15));
  top[-1] = 0;                                  // entry's return address: it never returns
  top[-2] = reinterpret_cast<uint64_t>(entry);  // where the switch's ret goes
  for (int r = 3; r <= 8; ++r) top[-r] = 0;     // rbp, rbx, r12..r15
  top[-9] = 0x1f80 | (uint64_t(0x037f) << 32);  // MXCSR and the x87 control word at their defaults
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
// arrive releases the others and runs on; a waiting thread switches straight to the next thread
// that can run, and to the scheduler only at the end of the block's list (which starts a new
// round).
struct Block {
  std::vector<Fiber> fibers;
  int count = 0;
  int done = 0;
  int at_sync = 0;
  Context scheduler;
  Fiber* running = nullptr;
  const std::function<void()>* body = nullptr;
  // Exactly the launch's bytes (so ASan sees overruns)
  std::unique_ptr<unsigned char[]> dynamic_shared;
  // By warp: the values of its last released warp op.
  std::vector<std::array<uint64_t, 32>> released;
  // By warp: its warp ops some lanes wait at, one per mask (masks of one warp's pending ops are
  // disjoint: lanes apart may exchange in groups of their own).
  struct PendingOp {
    unsigned mask;
    int lanes;    // in the mask
    int arrived;  // so far
  };
  std::vector<std::vector<PendingOp>> pending;
  std::string fault;  // set: the block stops, the launch fails
  // The order threads run in between barriers (OrderThreads()): by index, reversed, or shuffled.
  std::vector<Fiber*> order;
};
Block block;
std::mutex launch_mu;  // one launch at a time
std::atomic<uint64_t> kernels_run{0};

unsigned char* NewStack() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
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
// blocks run in the same kind of order (which one is last is all a kernel's "the last block to
// finish" can depend on here).
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
      std::fprintf(
          stderr,
          "CUDA emulator: TANDEM_CUDA_EMU_SCHEDULE must be forward, reverse or random, not '%s'\n",
          p);
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
  std::snprintf(s, sizeof(s), "block (%u,%u,%u) thread (%u,%u,%u)", f.state.block_idx.x,
                f.state.block_idx.y, f.state.block_idx.z, f.state.thread_idx.x,
                f.state.thread_idx.y, f.state.thread_idx.z);
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
      const std::string what = "threads wait at different __syncthreads: " + Where(*first) +
                               " at " + first->sync_file + ":" + std::to_string(first->sync_line) +
                               ", " + Where(f) + " at " + f.sync_file + ":" +
                               std::to_string(f.sync_line);
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
        return "a warp op's mask names lane " + std::to_string(m) +
               ", which has exited or does not exist (" + Where(f) + ")";
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

uint64_t KernelsRun() { return kernels_run.load(std::memory_order_relaxed); }

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
    name = end == std::string::npos ? sig
                                    : "a kernel (" + sig.substr(begin + 10, end - begin - 10) + ")";
  }
  return name.c_str();
}

cudaError_t LaunchGrid(const void* kernel, const char* name, dim3 grid, dim3 threads,
                       size_t shared_bytes, cudaStream_t stream, std::function<void()> body) {
  const uint64_t per_block = uint64_t(threads.x) * threads.y * threads.z;
  if (per_block == 0 || per_block > kMaxThreads || threads.z > 64 || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) {
    std::fprintf(
        stderr,
        "CUDA emulator: bad launch configuration of %s: grid (%u,%u,%u), block (%u,%u,%u)\n", name,
        grid.x, grid.y, grid.z, threads.x, threads.y, threads.z);
    return SetLast(cudaErrorInvalidConfiguration);
  }
  {
    std::lock_guard<std::mutex> lock(state_mu);
    const auto it = max_dynamic_shared.find(kernel);
    const size_t limit = it == max_dynamic_shared.end() ? kDefaultSharedLimit : size_t(it->second);
    if (shared_bytes > limit) {
      std::fprintf(
          stderr,
          "CUDA emulator: %s asks %zu bytes of dynamic shared memory, above its limit of %zu\n",
          name, shared_bytes, limit);
      return SetLast(cudaErrorInvalidValue);
    }
  }
  NoteHostCall(HostCall::kLaunch, name);
  return SetLast(Enqueue(
      stream,
      [name, grid, threads, shared_bytes, body = std::move(body), per_block]() -> cudaError_t {
        std::lock_guard<std::mutex> lock(launch_mu);
        kernels_run.fetch_add(1, std::memory_order_relaxed);
        const int count = static_cast<int>(per_block);
        if (block.fibers.size() < size_t(count)) block.fibers.resize(count);
        block.count = count;
        SetThreadStack(&block.scheduler);
        block.dynamic_shared.reset(shared_bytes > 0 ? new unsigned char[shared_bytes] : nullptr);
        block.body = &body;
        block.released.assign((count + 31) / 32, {});
        block.pending.assign((count + 31) / 32,
                             {});  // a block that completes leaves every warp's list empty
        // Blocks by linear index (x fastest), in the schedule's order.
        const uint64_t total = uint64_t(grid.x) * grid.y * grid.z;
        std::vector<uint64_t> shuffled;
        if (CurrentSchedule() == Schedule::kRandom) {
          shuffled.resize(total);
          std::iota(shuffled.begin(), shuffled.end(), uint64_t{0});
          Order(shuffled);
        }
        for (uint64_t i = 0; i < total; ++i) {
          const uint64_t linear = !shuffled.empty()                         ? shuffled[i]
                                  : CurrentSchedule() == Schedule::kReverse ? total - 1 - i
                                                                            : i;
          const uint3 b{unsigned(linear % grid.x), unsigned(linear / grid.x % grid.y),
                        unsigned(linear / grid.x / grid.y)};
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
