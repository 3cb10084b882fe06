// The emulated NCCL: the calls the NCCL KV link makes (common/transport/nccl/nccl_kv_link_impl.cc),
// over loopback TCP between processes, so that the link, and the service with --kv-transport nccl,
// run on the CUDA emulator's plugin on machines without a GPU. Communicators of two ranks; ncclSend
// and ncclRecv between them. Built against the real nccl.h, linked in place of libnccl.
//
// As with NCCL: ncclGetUniqueId starts a bootstrap root (a thread of the calling process, listening
// on 127.0.0.1) whose address the id carries; each rank's ncclCommInitRankConfig connects to it,
// and the root answers both once both have come (until then a non-blocking communicator is
// ncclInProgress; the root itself waits for its ranks with no timeout a caller would notice).
// Unlike NCCL, the ranks then keep talking through the root, which relays their bytes (its thread
// ends with either rank's connection). ncclSend and ncclRecv are stream work that completes once
// the bytes have moved (emu/async_work.h): an event recorded after one stays incomplete until then,
// while the enqueuing thread is free to poll, time out and abort, as on the device. A message moves
// as a header (its byte count) and the bytes; a receive of another size than the send fails with
// ncclInvalidUsage (NCCL leaves it undefined). A peer that closes its connection, or dies, shows as
// ncclRemoteError from ncclCommGetAsyncError, a broken socket as ncclSystemError; ncclCommAbort
// stops the communicator's threads without waiting for the peer. NCCL_* environment variables
// (NCCL_HOSTID, NCCL_SOCKET_IFNAME) have no effect here.
#include <arpa/inet.h>
#include <nccl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/base/socket_io.h"
#include "tests/support/cuda_emu/async_work.h"

namespace {

constexpr uint32_t kMagic = 0x54454e43;  // in ids and hellos: "CNET"
// A root none of whose ranks comes gives up after this (NCCL's waits for as long as the process
// lives).
constexpr auto kRootPatience = std::chrono::minutes(30);

// What an ncclUniqueId carries here: the root's port on 127.0.0.1 and a nonce its ranks repeat.
struct IdContents {
  uint32_t magic;
  uint16_t port;
  uint64_t nonce;
};
static_assert(sizeof(IdContents) <= sizeof(ncclUniqueId), "an id's contents fit ncclUniqueId");

// A rank's first message to the root.
struct Hello {
  uint32_t magic;
  int32_t rank;
  uint64_t nonce;
};

using tandem::RecvAll;
using tandem::SendAll;

thread_local std::string last_error;  // ncclGetLastError(nullptr), and a copy for a communicator's

bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  return r > 0;
}

// One direction of the root's relay: when either end closes or breaks, both are shut down.
void Pump(int from, int to) {
  std::vector<char> buffer(1 << 20);
  while (true) {
    const ssize_t r = ::recv(from, buffer.data(), buffer.size(), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || !SendAll(to, buffer.data(), static_cast<size_t>(r))) break;
  }
  ::shutdown(from, SHUT_RDWR);
  ::shutdown(to, SHUT_RDWR);
}

// The bootstrap root: waits for rank 0 and rank 1 (a connection that does not say hello with the
// id's nonce within 5 s, or names a rank already here, is dropped), answers both, then relays.
void RootMain(int listener, uint64_t nonce) {
  int rank_fd[2] = {-1, -1};
  const auto give_up = std::chrono::steady_clock::now() + kRootPatience;
  while ((rank_fd[0] < 0 || rank_fd[1] < 0) && std::chrono::steady_clock::now() < give_up) {
    if (!Readable(listener, 1000)) continue;
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) continue;
    Hello h{};
    if (!Readable(fd, 5000) || !RecvAll(fd, &h, sizeof(h)) || h.magic != kMagic ||
        h.nonce != nonce || h.rank < 0 || h.rank > 1 || rank_fd[h.rank] >= 0) {
      ::close(fd);
      continue;
    }
    rank_fd[h.rank] = fd;
  }
  ::close(listener);
  if (rank_fd[0] >= 0 && rank_fd[1] >= 0) {
    const char go = 1;
    SendAll(rank_fd[0], &go, 1);  // (a rank that left meanwhile: its relay ends at once)
    SendAll(rank_fd[1], &go, 1);
    std::thread other(Pump, rank_fd[0], rank_fd[1]);
    Pump(rank_fd[1], rank_fd[0]);
    other.join();
  }
  for (int fd : rank_fd) {
    if (fd >= 0) ::close(fd);
  }
}

size_t TypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

ncclResult_t Refuse(ncclResult_t r, const std::string& why) {
  last_error = why;
  return r;
}

// A communicator's state, shared with its threads and with the stream work of its operations (which
// may start after an abort: they then complete at once, touching nothing).
struct CommState {
  int rank = 0;
  IdContents id{};
  std::mutex mu;
  std::condition_variable cv;
  int fd = -1;
  ncclResult_t state = ncclInProgress;  // what ncclCommGetAsyncError answers
  std::string error;
  bool aborted = false;
  struct Op {
    void* buffer;
    size_t bytes;
    std::shared_ptr<tandem_emu::AsyncOp> done;
  };
  std::deque<Op> sends, receives;  // front: moving now
  std::thread init, sender, receiver;

  // Records the first error and completes every operation (mu held).
  void FailLocked(ncclResult_t r, const std::string& why) {
    if (!aborted && (state == ncclSuccess || state == ncclInProgress)) {
      state = r;
      error = why;
    }
    for (auto* q : {&sends, &receives}) {
      for (Op& op : *q) op.done->Complete();
      q->clear();
    }
    cv.notify_all();
  }
  void Fail(ncclResult_t r, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    FailLocked(r, why);
  }
  // A failed read or write of the connection (errno 0: the peer closed it).
  void Broken(const char* what) {
    const int e = errno;
    if (e == 0 || e == ECONNRESET || e == EPIPE) {
      Fail(ncclRemoteError, std::string(what) + ": the peer closed the connection");
    } else {
      Fail(ncclSystemError, std::string(what) + ": " + std::strerror(e));
    }
  }

  void InitMain();
  void Move(bool send);
  std::shared_ptr<tandem_emu::AsyncOp> Post(bool send, void* buffer, size_t bytes);
};

void CommState::InitMain() {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return Fail(ncclSystemError, std::string("socket: ") + std::strerror(errno));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) {
      ::close(s);
      return;
    }
    fd = s;
  }
  sockaddr_in root{};
  root.sin_family = AF_INET;
  root.sin_port = htons(id.port);
  root.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s, reinterpret_cast<const sockaddr*>(&root), sizeof(root)) != 0) {
    return Fail(ncclSystemError, "cannot reach the bootstrap root at 127.0.0.1:" +
                                     std::to_string(id.port) + ": " + std::strerror(errno));
  }
  {
    // An abort during connect() found nothing to shut down; the connection must not outlive it.
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) return;
  }
  const int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const Hello hello{kMagic, rank, id.nonce};
  char go = 0;
  if (!SendAll(s, &hello, sizeof(hello)) || !RecvAll(s, &go, 1))
    return Broken("joining at the bootstrap root");
  std::lock_guard<std::mutex> lock(mu);
  if (aborted || state != ncclInProgress) return;
  state = ncclSuccess;
  sender = std::thread([this] { Move(true); });
  receiver = std::thread([this] { Move(false); });
  cv.notify_all();
}

// The sender's or the receiver's thread: the front operation of its queue, one at a time.
void CommState::Move(bool send) {
  std::deque<Op>& queue = send ? sends : receives;
  while (true) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return aborted || state != ncclSuccess || !queue.empty(); });
      if (aborted || state != ncclSuccess) return;
      op = queue.front();
    }
    uint64_t header = op.bytes;
    if (send) {
      if (!SendAll(fd, &header, sizeof(header)) || !SendAll(fd, op.buffer, op.bytes))
        return Broken("ncclSend");
    } else {
      if (!RecvAll(fd, &header, sizeof(header))) return Broken("ncclRecv");
      if (header != op.bytes) {
        return Fail(ncclInvalidUsage, "ncclRecv: a message of " + std::to_string(header) +
                                          " bytes arrived for a receive of " +
                                          std::to_string(op.bytes) + " bytes");
      }
      if (!RecvAll(fd, op.buffer, op.bytes)) return Broken("ncclRecv");
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!queue.empty() && queue.front().done == op.done) queue.pop_front();
    }
    op.done->Complete();
  }
}

std::shared_ptr<tandem_emu::AsyncOp> CommState::Post(bool send, void* buffer, size_t bytes) {
  auto done = std::make_shared<tandem_emu::AsyncOp>();
  std::lock_guard<std::mutex> lock(mu);
  if (aborted || (state != ncclSuccess && state != ncclInProgress)) {
    done->Complete();  // an aborted or failed communicator moves nothing
    return done;
  }
  (send ? sends : receives).push_back({buffer, bytes, done});
  cv.notify_all();
  return done;
}

}  // namespace

struct ncclComm {
  std::shared_ptr<CommState> s;
};

namespace {

ncclResult_t Enqueue(bool send, void* buffer, size_t count, ncclDataType_t type, int peer,
                     ncclComm_t comm, cudaStream_t stream) {
  const char* what = send ? "ncclSend" : "ncclRecv";
  if (comm == nullptr) return Refuse(ncclInvalidArgument, std::string(what) + ": no communicator");
  const size_t element = TypeBytes(type);
  if (element == 0) return Refuse(ncclInvalidArgument, std::string(what) + ": unknown data type");
  if (count > 0 && buffer == nullptr)
    return Refuse(ncclInvalidArgument, std::string(what) + ": no buffer");
  std::shared_ptr<CommState> s = comm->s;
  if (peer != 1 - s->rank)
    return Refuse(ncclInvalidArgument,
                  std::string(what) + ": peer " + std::to_string(peer) + " is not the other rank");
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->state != ncclSuccess && s->state != ncclInProgress) return Refuse(s->state, s->error);
  }
  const size_t bytes = count * element;
  const cudaError_t e = tandem_emu::EnqueueAsync(
      stream, [s, send, buffer, bytes] { return s->Post(send, buffer, bytes); });
  if (e != cudaSuccess)
    return Refuse(ncclUnhandledCudaError, std::string(what) + ": " + cudaGetErrorString(e));
  return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr) {
    std::lock_guard<std::mutex> lock(comm->s->mu);
    last_error = comm->s->error;
  }
  return last_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* out) {
  if (out == nullptr) return Refuse(ncclInvalidArgument, "ncclGetUniqueId: no id");
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return Refuse(ncclSystemError, std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(listener, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(listener, 8) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const std::string why = std::string("the bootstrap root's socket: ") + std::strerror(errno);
    ::close(listener);
    return Refuse(ncclSystemError, why);
  }
  static std::mutex mu;
  static std::mt19937_64 random(std::random_device{}());
  IdContents id{kMagic, ntohs(a.sin_port), 0};
  {
    std::lock_guard<std::mutex> lock(mu);
    id.nonce = random();
  }
  std::thread(RootMain, listener, id.nonce).detach();
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out->internal, &id, sizeof(id));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr)
    return Refuse(ncclInvalidArgument, "ncclCommInitRankConfig: no communicator pointer");
  *comm = nullptr;
  if (nranks != 2)
    return Refuse(ncclInvalidArgument, "the emulated NCCL has communicators of two ranks only");
  if (rank < 0 || rank >= nranks) return Refuse(ncclInvalidArgument, "rank out of range");
  IdContents id;
  std::memcpy(&id, commId.internal, sizeof(id));
  if (id.magic != kMagic)
    return Refuse(ncclInvalidArgument, "not an id of the emulated NCCL's ncclGetUniqueId");
  if (config != nullptr && config->magic != 0xcafebeef) {
    return Refuse(ncclInvalidArgument,
                  "the config was not initialised with NCCL_CONFIG_INITIALIZER");
  }
  const bool blocking =
      config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  auto s = std::make_shared<CommState>();
  s->rank = rank;
  s->id = id;
  s->init = std::thread([raw = s.get()] { raw->InitMain(); });
  *comm = new ncclComm{s};
  if (!blocking) return ncclInProgress;
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait(lock, [&] { return s->state != ncclInProgress; });
  return s->state;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (comm == nullptr || error == nullptr)
    return Refuse(ncclInvalidArgument, "ncclCommGetAsyncError: no communicator");
  std::lock_guard<std::mutex> lock(comm->s->mu);
  *error = comm->s->state;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<CommState> s = comm->s;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->aborted = true;
    if (s->fd >= 0) ::shutdown(s->fd, SHUT_RDWR);  // wakes a thread blocked on the peer
    s->cv.notify_all();
  }
  if (s->init.joinable()) s->init.join();  // then sender and receiver are set, or never will be
  if (s->sender.joinable()) s->sender.join();
  if (s->receiver.joinable()) s->receiver.join();
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->FailLocked(ncclInternalError, "aborted");  // completes what was queued
    if (s->fd >= 0) ::close(s->fd);
    s->fd = -1;
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return Enqueue(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return Enqueue(false, recvbuff, count, datatype, peer, comm, stream);
}

}  // extern "C"
