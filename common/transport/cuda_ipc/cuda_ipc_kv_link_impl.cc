#include "common/transport/cuda_ipc/cuda_ipc_kv_link_impl.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/socket_io.h"
#include "common/base/status_macros.h"
#include "common/transport/staged_chunk.h"

namespace tandem {
namespace {

// A rendezvous is "tandem-kv-ipc-" NAME "-" SECRET, each 32 hex digits: the socket listens under
// the name, which any local process can see (/proc/net/unix); the secret travels only in the KV
// handshake reply, and the sender's hello must carry it, so no other process can pose as the
// sender.
constexpr char kRendezvousPrefix[] = "tandem-kv-ipc-";
constexpr size_t kRendezvousHex = 32;
constexpr size_t kSecretBytes = 16;
constexpr size_t kRendezvousSize =
    sizeof(kRendezvousPrefix) - 1 + kRendezvousHex + 1 + 2 * kSecretBytes;
// How long one connection to the rendezvous may take to say its hello before the receiver turns
// to the next (a process that connects and says nothing must not hold the sender off).
constexpr absl::Duration kHelloWait = absl::Seconds(2);

// The link's frames. The hello goes from the sender once; its answer back; then ready and done
// alternate, one of each a chunk.
constexpr char kHelloMagic[16] = "tandem-kv-ipc/1";
struct Hello {
  char magic[16];
  unsigned char secret[kSecretBytes];  // the rendezvous' secret
  int64_t staging_blocks;              // the chunk size both ends split layers by
  int64_t block_bytes;
  int32_t pid;  // for the receiver's messages
  int32_t device;
  cudaIpcMemHandle_t staging;
};
struct HelloAnswer {
  int32_t accepted;
  char reason[252];  // NUL-terminated when refused
};
enum FrameType : uint32_t { kReady = 0x52454459, kDone = 0x444f4e45 };
struct Frame {
  uint32_t type;
  int32_t layer;
  int64_t count;
};

std::string CudaError(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// The abstract-namespace address of a rendezvous name (no file, gone with its socket).
socklen_t AddressOf(const std::string& name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

bool IsRendezvous(const std::string& r) {
  const size_t name_end = sizeof(kRendezvousPrefix) - 1 + kRendezvousHex;
  if (r.size() != kRendezvousSize || !absl::StartsWith(r, kRendezvousPrefix) || r[name_end] != '-')
    return false;
  return std::all_of(r.begin() + sizeof(kRendezvousPrefix) - 1, r.begin() + name_end, IsHex) &&
         std::all_of(r.begin() + name_end + 1, r.end(), IsHex);
}

// The socket's name and the secret's bytes of a well-formed rendezvous.
std::string SocketName(const std::string& r) {
  return r.substr(0, sizeof(kRendezvousPrefix) - 1 + kRendezvousHex);
}
std::string Secret(const std::string& r) {
  return absl::HexStringToBytes(r.substr(r.size() - 2 * kSecretBytes));
}

bool SameSecret(const unsigned char* a, const std::string& b) {
  unsigned char diff = 0;  // the whole secret, whatever differs first
  for (size_t i = 0; i < kSecretBytes; ++i) diff |= a[i] ^ static_cast<unsigned char>(b[i]);
  return diff == 0;
}

// Waits until `fd` is readable (or hung up) or `deadline`; false on expiry.
bool WaitReadable(int fd, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{fd, POLLIN, 0};
    const int ms =
        static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1, 100));
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return true;  // the read that follows reports it
  }
}

// Reads exactly `n` bytes before `deadline`: OK, UNAVAILABLE (closed, or an error),
// DEADLINE_EXCEEDED.
absl::Status ReadBefore(int fd, void* data, size_t n, absl::Time deadline, const char* what) {
  if (!WaitReadable(fd, deadline))
    return absl::DeadlineExceededError(absl::StrCat(what, " timed out"));
  // The rest of a frame begun comes at once; the socket's own timeout (set at creation) bounds it.
  if (!RecvAll(fd, data, n)) {
    return absl::UnavailableError(errno == 0 ? absl::StrCat(what, ": the peer closed the link")
                                             : Errno(what));
  }
  return absl::OkStatus();
}

void SetSocketTimeouts(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

// ---------------------------------------------------------------- link

CudaIpcKvLink::~CudaIpcKvLink() {
  cudaSetDevice(device_);
  Abort();  // receiver: unmaps, closes the socket; sender: shuts its side
  bool released = staging_ == nullptr || rank_ == 1;
  if (rank_ == 0 && fd_ >= 0) {
    // The receiver unmaps before it closes its end: only then may the staging go.
    const absl::Time deadline = absl::Now() + kReleaseWait;
    char sink[64];
    while (!released && WaitReadable(fd_, deadline)) {
      const ssize_t n = ::recv(fd_, sink, sizeof(sink), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        released = true;
    }
  }
  if (fd_ >= 0) ::close(fd_);
  if (staging_ != nullptr && rank_ == 0) {
    if (released) {
      // (cudaMalloc memory: cudaFree, which waits for the device's work in flight, on this lane
      // thread only; once a link.)
      cudaFree(staging_);
    } else {
      // (stderr: the plugin does not link the processes' logging, which is not
      // position-independent.)
      std::fprintf(
          stderr,
          "W CUDA IPC KV link: the decode worker kept the staging memory mapped for %s after "
          "the link closed (stopped or wedged); %lld bytes of device memory are left "
          "allocated until this process ends\n",
          absl::FormatDuration(kReleaseWait).c_str(),
          static_cast<long long>(2 * staging_blocks_ * storage_->geometry().bytes_per_block()));
    }
  }
  if (index_ != nullptr) cudaFreeAsync(index_, stream_);
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  --*live_;
}

void CudaIpcKvLink::Unmap() {
  if (rank_ != 1 || staging_ == nullptr) return;
  cudaSetDevice(device_);  // (a failure may come before Move set it on this thread)
  // No scatter of ours may still read it (each was waited for, but a wait can time out).
  cudaStreamSynchronize(stream_);
  cudaIpcCloseMemHandle(staging_);
  staging_ = nullptr;
}

void CudaIpcKvLink::Abort() {
  if (aborted_) return;
  aborted_ = true;
  if (rank_ == 1) {
    Unmap();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  } else if (fd_ >= 0) {
    ::shutdown(fd_, SHUT_WR);  // the receiver sees the end; its close, later, releases the staging
  }
}

absl::Status CudaIpcKvLink::Failed(absl::StatusCode code, const std::string& why) {
  abort_reason_ =
      absl::StrCat("CUDA IPC KV link: ", why,
                   code == absl::StatusCode::kDeadlineExceeded ? " (the link was aborted)" : "");
  Abort();
  return absl::Status(code, abort_reason_);
}

absl::Status CudaIpcKvLink::Setup() {
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
    return absl::InternalError(CudaError(e));
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaStreamCreate: ", CudaError(e)));
  }
  if (cudaError_t e = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaEventCreate: ", CudaError(e)));
  }
  if (cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&index_),
                                      kChunkBlocks * sizeof(int32_t), stream_);
      e != cudaSuccess) {
    index_ = nullptr;
    return absl::ResourceExhaustedError(absl::StrCat("cudaMallocAsync: ", CudaError(e)));
  }
  return absl::OkStatus();
}

absl::Status CudaIpcKvLink::WaitEvent(absl::Time deadline, const char* what) {
  int sleep_us = 5;
  while (true) {
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady)
      return Failed(absl::StatusCode::kInternal, absl::StrCat(what, ": ", CudaError(q)));
    if (absl::Now() >= deadline)
      return Failed(absl::StatusCode::kDeadlineExceeded, absl::StrCat(what, " timed out"));
    ::usleep(sleep_us);
    sleep_us = std::min(sleep_us * 2, 200);
  }
}

absl::Status CudaIpcKvLink::SendFrame(uint32_t type, int32_t layer, int64_t count) {
  const Frame f{type, layer, count};
  if (!SendAll(fd_, &f, sizeof(f)))
    return Failed(absl::StatusCode::kUnavailable, Errno("sending to the peer"));
  return absl::OkStatus();
}

absl::Status CudaIpcKvLink::RecvFrame(uint32_t type, int32_t* layer, int64_t* count,
                                      absl::Time deadline, const char* what) {
  Frame f;
  if (absl::Status s = ReadBefore(fd_, &f, sizeof(f), deadline, what); !s.ok()) {
    return Failed(s.code(), std::string(s.message()));
  }
  if (f.type != type)
    return Failed(absl::StatusCode::kDataLoss, absl::StrCat(what, ": an unexpected frame"));
  *layer = f.layer;
  *count = f.count;
  return absl::OkStatus();
}

absl::Status CudaIpcKvLink::CopyChunk(bool pack, int32_t layer, const std::vector<int32_t>& blocks,
                                      int64_t first, int64_t count, absl::Time deadline) {
  // Landing needs no wait on the backend's stream: the engine reserves blocks between steps, and
  // every step ends by waiting for its work, so nothing queued still reads blocks a reservation
  // handed out.
  const char* what = pack ? "packing a layer" : "landing a layer";
  cudaError_t err =
      EnqueueChunkCopy(pack, storage_, layer, blocks, first, count, index_, staging_, stream_);
  if (err == cudaSuccess) err = cudaEventRecord(done_, stream_);
  if (err != cudaSuccess)
    return Failed(absl::StatusCode::kInternal, absl::StrCat(what, ": ", CudaError(err)));
  return WaitEvent(deadline, what);
}

absl::Status CudaIpcKvLink::Move(bool send, int32_t layer, const std::vector<int32_t>& blocks,
                                 int64_t num_blocks, const Landing* land, absl::Duration timeout,
                                 WorkMark* ready) {
  if (aborted_)
    return absl::UnavailableError(abort_reason_.empty() ? "CUDA IPC KV link: aborted"
                                                        : abort_reason_);
  if (const std::string why = LayerMoveProblem(storage_->geometry(), layer, blocks, num_blocks);
      !why.empty()) {
    return Failed(absl::StatusCode::kInvalidArgument, why);
  }
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return Failed(absl::StatusCode::kInternal, CudaError(e));
  }
  if (send && ready != nullptr) {
    // The layer's KV writes, marked when they were enqueued: later layers and steps may be
    // computing.
    RETURN_IF_ERROR(ready->Wait(absl::Now() + timeout));
  } else if (send) {
    // Every op enqueued on the backend's stream so far, the layer's KV writes among them.
    auto* compute = static_cast<cudaStream_t>(storage_->backend()->native_stream());
    cudaError_t e = cudaEventRecord(done_, compute);
    if (e == cudaSuccess) e = cudaEventSynchronize(done_);
    if (e != cudaSuccess) return Failed(absl::StatusCode::kInternal, CudaError(e));
  }
  const absl::Time deadline = absl::Now() + timeout;
  const bool discard = !send && land == nullptr;  // DiscardLayer: any layer's chunks
  for (int64_t first = 0; first < num_blocks; first += staging_blocks_) {
    const int64_t count = std::min<int64_t>(staging_blocks_, num_blocks - first);
    int32_t got_layer = 0;
    int64_t got_count = 0;
    if (send) {
      RETURN_IF_ERROR(CopyChunk(/*pack=*/true, layer, blocks, first, count, deadline));
      RETURN_IF_ERROR(SendFrame(kReady, layer, count));
      RETURN_IF_ERROR(
          RecvFrame(kDone, &got_layer, &got_count, deadline, "waiting for the receiver"));
      if (got_layer != layer || got_count != count) {
        return Failed(absl::StatusCode::kDataLoss, "the receiver acknowledged another chunk");
      }
      continue;
    }
    RETURN_IF_ERROR(RecvFrame(kReady, &got_layer, &got_count, deadline, "waiting for the sender"));
    if ((!discard && got_layer != layer) || got_count != count) {
      return Failed(
          absl::StatusCode::kDataLoss,
          absl::StrCat("the sender packed ", got_count, " blocks of layer ", got_layer, " where ",
                       count, " of layer ", discard ? got_layer : layer, " were due"));
    }
    if (land != nullptr) {
      absl::Status landed;
      (*land)([&] { landed = CopyChunk(/*pack=*/false, layer, blocks, first, count, deadline); });
      RETURN_IF_ERROR(landed);
    }
    RETURN_IF_ERROR(SendFrame(kDone, got_layer, got_count));
  }
  return absl::OkStatus();
}

absl::Status CudaIpcKvLink::SendLayer(int32_t layer, const std::vector<int32_t>& blocks,
                                      absl::Duration timeout, WorkMark* ready) {
  return Move(true, layer, blocks, static_cast<int64_t>(blocks.size()), nullptr, timeout, ready);
}

absl::Status CudaIpcKvLink::RecvLayer(int32_t layer, const std::vector<int32_t>& blocks,
                                      const Landing& land, absl::Duration timeout) {
  return Move(false, layer, blocks, static_cast<int64_t>(blocks.size()), &land, timeout);
}

absl::Status CudaIpcKvLink::DiscardLayer(int32_t num_blocks, absl::Duration timeout) {
  return Move(false, 0, {}, num_blocks, nullptr, timeout);
}

// ---------------------------------------------------------------- factory

absl::StatusOr<std::unique_ptr<CudaIpcKvLinkFactory>> CudaIpcKvLinkFactory::Create(
    KvCacheStorage* storage) {
  if (storage == nullptr || storage->backend()->native_stream() == nullptr ||
      storage->backend()->device_ordinal() < 0) {
    return absl::FailedPreconditionError(
        "--kv-transport cuda-ipc needs the KV cache in CUDA memory (--device cuda)");
  }
  if (storage->geometry().bytes_per_block() % 4 != 0) {
    return absl::FailedPreconditionError(
        "--kv-transport cuda-ipc moves KV blocks as 4-byte words: this cache's blocks "
        "are not a whole number of them (an odd head_dim with a 16-bit cache)");
  }
  return std::unique_ptr<CudaIpcKvLinkFactory>(
      new CudaIpcKvLinkFactory(storage, storage->backend()->device_ordinal()));
}

CudaIpcKvLinkFactory::~CudaIpcKvLinkFactory() {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, fd] : listeners_) ::close(fd);
}

absl::StatusOr<std::string> CudaIpcKvLinkFactory::NewRendezvous() {
  std::random_device rd;
  std::string name(kRendezvousHex / 2, '\0'), secret(kSecretBytes, '\0');
  for (char& c : name) c = static_cast<char>(rd());
  for (char& c : secret) c = static_cast<char>(rd());
  const std::string rendezvous = absl::StrCat(kRendezvousPrefix, absl::BytesToHexString(name), "-",
                                              absl::BytesToHexString(secret));
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(Errno("socket"));
  sockaddr_un addr;
  const socklen_t len = AddressOf(SocketName(rendezvous), &addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 4) != 0) {
    const std::string why = Errno("binding the CUDA IPC rendezvous socket");
    ::close(fd);
    return absl::UnavailableError(why);
  }
  absl::MutexLock lock(&mu_);
  listeners_.emplace_back(rendezvous, fd);
  return rendezvous;
}

int CudaIpcKvLinkFactory::TakeListener(const std::string& rendezvous) {
  absl::MutexLock lock(&mu_);
  for (auto it = listeners_.begin(); it != listeners_.end(); ++it) {
    if (it->first == rendezvous) {
      const int fd = it->second;
      listeners_.erase(it);
      return fd;
    }
  }
  return -1;
}

void CudaIpcKvLinkFactory::Abandon(const std::string& rendezvous,
                                   const std::vector<int>& /*ranks*/) {
  if (const int fd = TakeListener(rendezvous); fd >= 0) ::close(fd);
}

absl::StatusOr<std::unique_ptr<KvLink>> CudaIpcKvLinkFactory::Join(const std::string& rendezvous,
                                                                   int rank,
                                                                   absl::Duration timeout) {
  if (!IsRendezvous(rendezvous)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a CUDA IPC rendezvous is '", kRendezvousPrefix, "', a name and a secret of ",
        kRendezvousHex, " hex digits each, not a ", rendezvous.size(), "-byte string"));
  }
  if (rank != 0 && rank != 1)
    return absl::InvalidArgumentError("rank must be 0 (sender) or 1 (receiver)");
  const absl::Time deadline = absl::Now() + timeout;
  const KvCacheGeometry& g = storage_->geometry();
  if (rank == 1) {
    const int listener = TakeListener(rendezvous);
    if (listener < 0)
      return absl::InvalidArgumentError(
          "no such CUDA IPC rendezvous here (already joined or abandoned)");
    // Connections until one says the rendezvous' secret (anyone local can connect to the name).
    const std::string secret = Secret(rendezvous);
    int fd = -1;
    Hello hello;
    int strangers = 0;
    while (fd < 0) {
      if (!WaitReadable(listener, deadline)) {
        ::close(listener);
        return absl::DeadlineExceededError(absl::StrCat(
            "CUDA IPC KV link: the sender did not connect in time",
            strangers > 0 ? absl::StrCat(" (", strangers,
                                         " other connections did not know the rendezvous' secret)")
                          : ""));
      }
      const int c = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      SetSocketTimeouts(c);
      if (ReadBefore(c, &hello, sizeof(hello), std::min(deadline, absl::Now() + kHelloWait),
                     "hello")
              .ok() &&
          SameSecret(hello.secret, secret)) {
        fd = c;
      } else {
        ::close(c);
        ++strangers;
      }
    }
    ::close(listener);
    std::unique_ptr<CudaIpcKvLink> link(new CudaIpcKvLink(storage_, device_, 1, fd, live_));
    RETURN_IF_ERROR(link->Setup());
    std::string why;
    if (std::memcmp(hello.magic, kHelloMagic, sizeof(kHelloMagic)) != 0) {
      why = "not a CUDA IPC KV sender of this version";
    } else if (hello.block_bytes != g.bytes_per_block()) {
      why = absl::StrCat("the sender's KV blocks have ", hello.block_bytes,
                         " bytes, this worker's ", g.bytes_per_block());
    } else if (hello.staging_blocks <= 0 || hello.staging_blocks > CudaIpcKvLink::kChunkBlocks) {
      why = absl::StrCat("a staging of ", hello.staging_blocks, " blocks");
    } else {
      void* mapped = nullptr;
      if (cudaError_t e =
              cudaIpcOpenMemHandle(&mapped, hello.staging, cudaIpcMemLazyEnablePeerAccess);
          e != cudaSuccess) {
        cudaGetLastError();
        why = absl::StrCat(
            "cannot map the prefill worker's (pid ", hello.pid, ", GPU ", hello.device,
            ") memory on GPU ", device_, ": cudaIpcOpenMemHandle: ", CudaError(e),
            "; CUDA IPC needs both workers on one machine, sharing a GPU or GPUs with peer access, "
            "and able to see each other's processes (containers: host IPC and PID namespaces); "
            "else use --kv-transport nccl");
      } else {
        link->staging_ = static_cast<float*>(mapped);
        link->staging_blocks_ = hello.staging_blocks;
      }
    }
    HelloAnswer answer{};
    answer.accepted = why.empty() ? 1 : 0;
    std::snprintf(answer.reason, sizeof(answer.reason), "%s", why.c_str());
    if (!SendAll(fd, &answer, sizeof(answer)))
      return absl::UnavailableError(Errno("answering the CUDA IPC sender"));
    if (!why.empty()) return absl::FailedPreconditionError(absl::StrCat("CUDA IPC KV link: ", why));
    return std::unique_ptr<KvLink>(std::move(link));
  }

  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(Errno("socket"));
  sockaddr_un addr;
  const socklen_t len = AddressOf(SocketName(rendezvous), &addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const std::string why = Errno("connecting to the decode worker's CUDA IPC rendezvous");
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat(why,
                     " (the workers must share a machine and a network namespace; "
                     "else use --kv-transport nccl)"));
  }
  SetSocketTimeouts(fd);
  std::unique_ptr<CudaIpcKvLink> link(new CudaIpcKvLink(storage_, device_, 0, fd, live_));
  RETURN_IF_ERROR(link->Setup());
  const int64_t staging_blocks = std::min<int64_t>(CudaIpcKvLink::kChunkBlocks, g.num_blocks);
  const size_t bytes = 2 * static_cast<size_t>(staging_blocks) * g.bytes_per_block();
  // Plain cudaMalloc: only its memory can be exported (cudaIpcGetMemHandle).
  if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&link->staging_), bytes);
      e != cudaSuccess) {
    link->staging_ = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("CUDA IPC KV link: allocating ", bytes, " bytes of staging: ", CudaError(e)));
  }
  link->staging_blocks_ = staging_blocks;
  Hello hello{};
  std::memcpy(hello.magic, kHelloMagic, sizeof(kHelloMagic));
  const std::string secret = Secret(rendezvous);
  std::memcpy(hello.secret, secret.data(), kSecretBytes);
  hello.staging_blocks = staging_blocks;
  hello.block_bytes = g.bytes_per_block();
  hello.pid = static_cast<int32_t>(::getpid());
  hello.device = device_;
  if (cudaError_t e = cudaIpcGetMemHandle(&hello.staging, link->staging_); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA IPC KV link: cudaIpcGetMemHandle: ", CudaError(e)));
  }
  if (!SendAll(fd, &hello, sizeof(hello)))
    return absl::UnavailableError(Errno("CUDA IPC KV link: sending the hello"));
  HelloAnswer answer;
  RETURN_IF_ERROR(
      ReadBefore(fd, &answer, sizeof(answer), deadline, "CUDA IPC KV link: the receiver's answer"));
  if (answer.accepted != 1) {
    answer.reason[sizeof(answer.reason) - 1] = '\0';
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA IPC KV link refused by the decode worker: ", answer.reason));
  }
  return std::unique_ptr<KvLink>(std::move(link));
}

}  // namespace tandem
