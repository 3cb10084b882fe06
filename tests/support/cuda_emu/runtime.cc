// The CUDA emulator's runtime (cuda_emu.h): device memory is host memory, and the CUDA runtime
// calls this project makes are implemented here (kernel launches: launch.cc; cuBLAS: cublas.cc),
// with the device's rules where breaking them is a bug of ours (allocation or a synchronisation
// inside a graph capture, an event timed before it was recorded), and its stream order: work runs
// when enqueued, or (deferred) when a synchronisation needs it; async work holds its stream
// (async_work.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/cuda_emu/async_work.h"
#include "tests/support/cuda_emu/cuda_emu.h"
#include "tests/support/cuda_emu/runtime_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace tandem_emu {

std::mutex state_mu;

namespace {

size_t allocated_bytes = 0;
// One device allocation. cudaMalloc's are mappings of their own (page-granular), so that one can be
// exported to another process (cudaIpcGetMemHandle) by turning it into a shared mapping of a memfd
// at the same address; the stream-ordered allocator's, like the device's default pool, cannot be.
struct Allocation {
  size_t bytes = 0;    // asked for
  size_t rounded = 0;  // what the device would take (256-byte granules): the accounting
  // > 0: an mmap of this many bytes (cudaMalloc's, and large pool ones), else aligned_alloc.
  size_t mapped = 0;
  bool shareable = false;  // cudaMalloc's: cudaIpcGetMemHandle may export it
  int memfd = -1;          // once exported: the memfd behind the mapping, opened by importers
};
std::map<void*, Allocation> allocations;
std::map<void*, size_t> imported;  // cudaIpcOpenMemHandle's mappings (state_mu)
thread_local cudaError_t last_error = cudaSuccess;
// The stream this thread is capturing (thread-local mode)
thread_local CUstream_st* thread_capture = nullptr;

size_t DeviceMemoryBytes() {
  static const size_t bytes = [] {
    const char* p = std::getenv("TANDEM_CUDA_EMU_MEMORY_MB");
    return (p != nullptr ? std::strtoull(p, nullptr, 10) : 4096ull) << 20;
  }();
  return bytes;
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
      {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
       "invalid configuration argument"},
      {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
      {cudaErrorLaunchFailure, "cudaErrorLaunchFailure",
       "unspecified launch failure (the emulator printed why)"},
      {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
       "operation not permitted when stream is capturing"},
      {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
       "operation failed due to a previous error during capture"},
      {cudaErrorIllegalState, "cudaErrorIllegalState",
       "the operation cannot be performed in the present state"},
      {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
      {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
      {cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed",
       "mapping of buffer object failed"},
  };
  static const ErrorText kUnknown = {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"};
  for (const ErrorText& t : kTexts) {
    if (t.code == e) return t;
  }
  return kUnknown;
}

// Stream order (TANDEM_CUDA_EMU_STREAMS): "eager" (the default) runs work when it is enqueued;
// "deferred" queues it on its stream until a synchronisation needs it, so that a read on one stream
// of what another wrote without synchronising sees the old bytes, as it may on the device. Queues
// run in enqueue order within a stream; the legacy default stream (nullptr) and blocking streams
// wait for each other's earlier work; non-blocking streams wait for nothing. Errors of queued work
// are reported by the synchronisation that runs it.
struct Pending {
  uint64_t seq;
  std::function<cudaError_t()> work;
};
std::mutex queue_mu;  // the queues below
std::mutex flush_mu;  // one flush at a time: a stream's work never runs on two threads at once
uint64_t next_seq = 0;
std::map<cudaStream_t, std::deque<Pending>> queues;  // nullptr: the legacy stream

std::atomic<int> deferred_mode{-1};  // -1: not read from the environment yet
bool Deferred() {
  int mode = deferred_mode.load();
  if (mode < 0) {
    const char* p = std::getenv("TANDEM_CUDA_EMU_STREAMS");
    const std::string v = p != nullptr ? p : "eager";
    if (v != "eager" && v != "deferred") {
      std::fprintf(stderr,
                   "CUDA emulator: TANDEM_CUDA_EMU_STREAMS must be eager or deferred, not '%s'\n",
                   p);
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

// Runs queued work until `target`'s queue is empty (all queues when `all`), in order; the first
// error.
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
// `behind`; whichever thread next looks at the stream after the op completed runs that work, in
// order, up to the next op. (A stream's work is enqueued by one thread at a time in this project;
// two threads enqueueing on one stream at once could reorder work that was not behind an op.)
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

// Blocks until `done()` (asked under async_mu), running the work behind `stream`'s async ops as
// they complete.
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
  WaitUntil(stream, [stream] {
    return stream->in_flight == nullptr && stream->behind.empty() && !stream->draining;
  });
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

}  // namespace

cudaError_t SetLast(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

// Work for `stream`: recorded when it is being captured, else run now or queued (Deferred());
// behind an async op in flight on it, queued there.
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

namespace {
std::atomic<bool> host_log_on{false};
std::mutex host_log_mu;
std::vector<HostCallEntry> host_log;  // (host_log_mu)
}  // namespace

void NoteHostCall(HostCall kind, const char* what) {
  if (!host_log_on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(host_log_mu);
  if (host_log_on.load(std::memory_order_relaxed)) host_log.push_back({kind, what});
}

void StartHostLog() {
  std::lock_guard<std::mutex> lock(host_log_mu);
  host_log.clear();
  host_log_on = true;
}

std::vector<HostCallEntry> TakeHostLog() {
  std::lock_guard<std::mutex> lock(host_log_mu);
  host_log_on = false;
  return std::move(host_log);
}

bool SetStreams(const char* name) {
  const std::string v = name;
  if (v != "eager" && v != "deferred") return false;
  Flush(nullptr, /*all=*/true);
  deferred_mode.store(v == "deferred" ? 1 : 0);
  return true;
}

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
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : SetLast(cudaErrorInvalidDevice);
}
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
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = int(tandem_emu::kMaxSharedOptIn);
      return cudaSuccess;
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
  if (value < 0 || size_t(value) > tandem_emu::kMaxSharedOptIn)
    return SetLast(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(tandem_emu::state_mu);
  tandem_emu::max_dynamic_shared[func] = value;
  return cudaSuccess;
}

// --- Memory ---

}  // extern "C"

namespace tandem_emu {
namespace {

size_t PageBytes() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// Allocations of at least this many bytes are mappings of their own, and memsets to 0 of at least
// this many bytes inside one give the whole pages back to the kernel (MADV_DONTNEED: a private
// anonymous mapping reads zeros after it) instead of writing them: the backend zeroes every
// allocation, and the KV cache is most of the emulated device.
constexpr size_t kZeroByPagesBytes = size_t{1} << 20;

// Zeroes [p, p + bytes): with `by_pages` (the range lies in a private mapping of this process's
// allocations, not an exported one, whose pages are a memfd's: ZeroablePages) the whole pages by
// MADV_DONTNEED and the rest by memset; else by memset.
void ZeroBytes(void* p, size_t bytes, bool by_pages) {
  char* begin = static_cast<char*>(p);
  char* end = begin + bytes;
  if (by_pages) {
    const size_t page = PageBytes();
    char* first =
        reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page);
    char* last = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(end) / page * page);
    if (first < last && ::madvise(first, static_cast<size_t>(last - first), MADV_DONTNEED) == 0) {
      std::memset(begin, 0, static_cast<size_t>(first - begin));
      std::memset(last, 0, static_cast<size_t>(end - last));
      return;
    }
  }
  std::memset(begin, 0, bytes);
}

// Whether a memset of `bytes` at p to 0 may give pages back (see ZeroBytes).
bool ZeroablePages(void* p, size_t bytes) {
  if (bytes < kZeroByPagesBytes) return false;
  std::lock_guard<std::mutex> lock(state_mu);
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return false;
  --it;
  const Allocation& a = it->second;
  return a.mapped > 0 && a.memfd < 0 &&
         static_cast<char*>(p) + bytes <= static_cast<char*>(it->first) + a.bytes;
}

// `shareable`: a mapping of its own (cudaMalloc), which cudaIpcGetMemHandle can export.
cudaError_t Allocate(void** p, size_t bytes, bool shareable) {
  *p = nullptr;
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  std::lock_guard<std::mutex> lock(state_mu);
  Allocation a;
  a.bytes = bytes;
  a.rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  if (allocated_bytes + a.rounded > DeviceMemoryBytes()) return SetLast(cudaErrorMemoryAllocation);
  // Large pool allocations are mappings of their own too (not exportable): zeroing them whole is
  // then giving their pages back (ZeroBytes), where a memset would write every byte.
  a.shareable = shareable;
  if (shareable || a.rounded >= kZeroByPagesBytes) {
    a.mapped = (a.rounded + PageBytes() - 1) / PageBytes() * PageBytes();
    void* m = ::mmap(nullptr, a.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return SetLast(cudaErrorMemoryAllocation);
    *p = m;
  } else {
    *p = std::aligned_alloc(256, a.rounded);
    if (*p == nullptr) return SetLast(cudaErrorMemoryAllocation);
  }
#if defined(__SANITIZE_ADDRESS__)
  // The device's allocations are 256-byte aligned; past the bytes asked for is still out of bounds.
  __asan_poison_memory_region(static_cast<char*>(*p) + bytes,
                              (a.mapped > 0 ? a.mapped : a.rounded) - bytes);
#endif
  allocated_bytes += a.rounded;
  allocations[*p] = a;
  return cudaSuccess;
}

cudaError_t Release(void* p) {
  std::lock_guard<std::mutex> lock(state_mu);
  const auto it = allocations.find(p);
  if (it == allocations.end()) return cudaErrorInvalidValue;
  const Allocation a = it->second;
  allocated_bytes -= a.rounded;
  allocations.erase(it);
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(p, a.mapped > 0 ? a.mapped : a.rounded);
#endif
  if (a.mapped > 0) {
    ::munmap(p, a.mapped);
    // An importer's mapping keeps the memfd's pages (the device leaves that undefined: importers
    // must close first).
    if (a.memfd >= 0) ::close(a.memfd);
  } else {
    std::free(p);
  }
  return cudaSuccess;
}

// What an emulated cudaIpcMemHandle_t holds: the exporter's memfd, reached as /proc/PID/fd/FD.
struct IpcHandle {
  char magic[8];  // "tandemIP"
  int32_t pid;
  int32_t fd;
  uint64_t bytes;
};
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t));
constexpr char kIpcMagic[8] = {'t', 'a', 'n', 'd', 'e', 'm', 'I', 'P'};

}  // namespace
}  // namespace tandem_emu

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
  return tandem_emu::Allocate(p, bytes, /*shareable=*/true);
}

// Exporting turns the allocation into a shared mapping of a memfd holding its bytes, at the same
// address (MAP_FIXED replaces the private pages), which importers map through /proc. Not while
// kernels write it: export before use, as the link does.
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* dev_ptr) {
  using namespace tandem_emu;
  std::lock_guard<std::mutex> lock(state_mu);
  const auto it = allocations.find(dev_ptr);
  // The base of a cudaMalloc allocation only (the device's rule; the pool's memory is not
  // exportable).
  if (it == allocations.end() || !it->second.shareable) return SetLast(cudaErrorInvalidValue);
  Allocation& a = it->second;
  if (a.memfd < 0) {
    const int fd = ::memfd_create("tandem-cuda-emu-ipc", MFD_CLOEXEC);
    if (fd < 0) return SetLast(cudaErrorMemoryAllocation);
    bool ok = ::ftruncate(fd, static_cast<off_t>(a.mapped)) == 0;
    // The bytes asked for (past them AddressSanitizer builds poison the pages; the memfd reads
    // zeros).
    for (size_t done = 0; ok && done < a.bytes;) {
      const ssize_t n = ::pwrite(fd, static_cast<char*>(dev_ptr) + done, a.bytes - done,
                                 static_cast<off_t>(done));
      ok = n > 0;
      done += ok ? static_cast<size_t>(n) : 0;
    }
    if (!ok || ::mmap(dev_ptr, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
                   MAP_FAILED) {
      ::close(fd);
      return SetLast(cudaErrorMemoryAllocation);
    }
    a.memfd = fd;
  }
  IpcHandle h{};
  std::memcpy(h.magic, kIpcMagic, sizeof(kIpcMagic));
  h.pid = static_cast<int32_t>(::getpid());
  h.fd = a.memfd;
  h.bytes = a.mapped;
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** dev_ptr, cudaIpcMemHandle_t handle,
                                 unsigned int /*flags*/) {
  using namespace tandem_emu;
  *dev_ptr = nullptr;
  IpcHandle h;
  std::memcpy(&h, &handle, sizeof(h));
  if (std::memcmp(h.magic, kIpcMagic, sizeof(kIpcMagic)) != 0)
    return SetLast(cudaErrorInvalidResourceHandle);
  // The device opens handles of other processes only.
  if (h.pid == static_cast<int32_t>(::getpid())) return SetLast(cudaErrorDeviceUninitialized);
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return SetLast(cudaErrorMapBufferObjectFailed);  // the exporter is gone, or freed it
  void* m = ::mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return SetLast(cudaErrorMapBufferObjectFailed);
  std::lock_guard<std::mutex> lock(state_mu);
  imported[m] = h.bytes;
  *dev_ptr = m;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* dev_ptr) {
  using namespace tandem_emu;
  std::lock_guard<std::mutex> lock(state_mu);
  const auto it = imported.find(dev_ptr);
  if (it == imported.end()) return SetLast(cudaErrorInvalidValue);
  ::munmap(it->first, it->second);
  imported.erase(it);
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  tandem_emu::NoteHostCall(tandem_emu::HostCall::kWait, "cudaFree");
  // As on the device, freeing waits for the work before it, async work included.
  tandem_emu::Flush(nullptr, /*all=*/true);
  tandem_emu::WaitAllAsync();
  return SetLast(tandem_emu::Release(p));
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) {
  return tandem_emu::Allocate(p, bytes, /*shareable=*/false);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  // Unlike cudaFree's, its documentation makes no null pointer a no-op: refused here, the stricter
  // reading, so that a caller's missing check shows.
  if (p == nullptr) return SetLast(cudaErrorInvalidValue);
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
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  using tandem_emu::HostCall;
  tandem_emu::NoteHostCall(kind == cudaMemcpyHostToDevice   ? HostCall::kUpload
                           : kind == cudaMemcpyDeviceToHost ? HostCall::kRead
                                                            : HostCall::kLaunch,
                           "cudaMemcpyAsync");
  if (kind == cudaMemcpyHostToDevice && tandem_emu::Deferred() &&
      !(stream != nullptr && stream->capturing)) {
    // From (pageable) host memory the device stages the bytes before the call returns: the caller
    // may reuse its buffer at once.
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
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
  tandem_emu::NoteHostCall(tandem_emu::HostCall::kWait, "cudaMemcpy");
  if (const cudaError_t e = tandem_emu::Flush(nullptr, false); e != cudaSuccess) return SetLast(e);
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  tandem_emu::NoteHostCall(tandem_emu::HostCall::kLaunch, "cudaMemsetAsync");
  const bool by_pages = value == 0 && tandem_emu::ZeroablePages(p, bytes);
  return SetLast(Enqueue(stream, [p, value, bytes, by_pages] {
    if (value == 0) {
      tandem_emu::ZeroBytes(p, bytes, by_pages);
    } else {
      std::memset(p, value, bytes);
    }
    return cudaSuccess;
  }));
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  tandem_emu::NoteHostCall(tandem_emu::HostCall::kWait, "cudaMemset");
  if (const cudaError_t e = tandem_emu::Flush(nullptr, false); e != cudaSuccess) return SetLast(e);
  if (value == 0) {
    tandem_emu::ZeroBytes(p, bytes, tandem_emu::ZeroablePages(p, bytes));
  } else {
    std::memset(p, value, bytes);
  }
  return cudaSuccess;
}

// --- Streams, events, graphs ---

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  *stream = new CUstream_st;
  (*stream)->blocking = (flags & cudaStreamNonBlocking) == 0;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}
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
  tandem_emu::NoteHostCall(tandem_emu::HostCall::kWait, "cudaStreamSynchronize");
  const cudaError_t e = tandem_emu::Flush(stream, false);
  tandem_emu::WaitAsync(stream);
  return SetLast(e);
}
cudaError_t cudaDeviceSynchronize() {
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  tandem_emu::NoteHostCall(tandem_emu::HostCall::kWait, "cudaDeviceSynchronize");
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
  *status = stream != nullptr && stream->capturing ? cudaStreamCaptureStatusActive
                                                   : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return SetLast(cudaErrorInvalidResourceHandle);
  tandem_emu::NoteHostCall(tandem_emu::HostCall::kLaunch, "cudaGraphLaunch");
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
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event,
                                     unsigned int /*flags: timing is always kept*/) {
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event->unrun.load() > 0) tandem_emu::Drain(event->stream);
  // A record still queued (deferred, or behind async work) refers to the event: as on the device,
  // it is destroyed once that work has run, here never (a leak of a few bytes, in tests).
  if (event->unrun.load() == 0) delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  event->stream = stream;
  // A record captured into a graph runs at each replay, counted by none.
  const bool counted =
      !(stream != nullptr && stream->capturing && stream->capturer == std::this_thread::get_id());
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
  tandem_emu::NoteHostCall(tandem_emu::HostCall::kWait, "cudaEventSynchronize");
  // Eager: recorded work has run (and an event never recorded has nothing to wait for), unless it
  // waits behind async work. Deferred: the event's stream is run to its end (a little more than up
  // to the event).
  const cudaError_t e = tandem_emu::Flush(event->stream, false);
  tandem_emu::WaitEvent(event);
  return SetLast(e);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int /*flags*/) {
  (void)stream;
  if (tandem_emu::thread_capture != nullptr)
    return cudaSuccess;  // (captured work runs at replay, in order)
  // Eager: the event's work has run, or this waits on the host for the async work it is behind.
  // Deferred: the event's stream runs to its end now, before anything `stream` queues after this
  // (more than the wait asks for, never less).
  const cudaError_t e = tandem_emu::Flush(event->stream, false);
  tandem_emu::WaitEvent(event);
  return SetLast(e);
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (RefusedInCapture()) return cudaErrorStreamCaptureUnsupported;
  // Complete once run: eager work has, unless it waits behind async work in flight; deferred work
  // up to the event runs now (as a synchronisation).
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
