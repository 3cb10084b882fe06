#include "common/transport/kv_control.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/socket_io.h"
#include "common/base/status_macros.h"
#include "common/rpc/dtype_proto.h"
#include "tandem/v1/kv_transfer.pb.h"

namespace tandem {
namespace {

enum FrameType : uint8_t {
  kHandshake = 1,
  kHandshakeReply = 2,
  kBegin = 3,
  kLayerHeader = 4,
  kLayerPayload = 5,
  kEnd = 6,
  kAck = 7,
};
constexpr uint32_t kMaxControlFrame = 1 << 20;

absl::Status SendFrame(KvStream& stream, FrameType type, const void* data, size_t n) {
  unsigned char header[5];
  const uint32_t len = static_cast<uint32_t>(n);
  std::memcpy(header, &len, 4);
  header[4] = type;
  RETURN_IF_ERROR(stream.Write(header, sizeof(header)));
  return stream.Write(data, n);
}

absl::Status SendMessage(KvStream& stream, FrameType type, const google::protobuf::MessageLite& m) {
  const std::string bytes = m.SerializeAsString();
  return SendFrame(stream, type, bytes.data(), bytes.size());
}

// Reads a frame header: its type and payload length.
absl::Status ReadHeader(KvStream& stream, FrameType* type, uint32_t* len) {
  unsigned char header[5];
  RETURN_IF_ERROR(stream.Read(header, sizeof(header)));
  std::memcpy(len, header, 4);
  *type = static_cast<FrameType>(header[4]);
  return absl::OkStatus();
}

absl::Status ReadMessage(KvStream& stream, FrameType expected, google::protobuf::MessageLite* m) {
  FrameType type;
  uint32_t len;
  RETURN_IF_ERROR(ReadHeader(stream, &type, &len));
  if (type != expected || len > kMaxControlFrame) {
    return absl::DataLossError(absl::StrCat("KV transfer: expected frame ", expected, ", got ",
                                            type, " of ", len, " bytes"));
  }
  std::string bytes(len, '\0');
  RETURN_IF_ERROR(stream.Read(bytes.data(), len));
  if (!m->ParseFromString(bytes))
    return absl::DataLossError("KV transfer: malformed control message");
  return absl::OkStatus();
}

void SetTimeouts(int fd, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Layers are megabytes: large socket buffers keep the pipe full (the kernel caps them at
  // net.core.{w,r}mem_max).
  int buffer = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
}

}  // namespace

std::string NewKvCapability() {
  unsigned char bytes[16];
  for (size_t got = 0; got < sizeof(bytes);) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      TANDEM_LOG(ERROR) << "getrandom failed: " << std::strerror(errno);
      std::abort();  // no unguessable capabilities: refuse to run rather than issue weak ones
    }
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

bool KvCapabilityMatches(const std::string& issued, const std::string& presented) {
  if (issued.empty()) return true;
  if (presented.size() != issued.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < issued.size(); ++i)
    diff |= static_cast<unsigned char>(issued[i] ^ presented[i]);
  return diff == 0;
}

void KvGeometryToProto(const KvCacheGeometry& g, v1::KvGeometry* p) {
  p->set_num_layers(static_cast<int32_t>(g.num_layers));
  p->set_num_kv_heads(static_cast<int32_t>(g.num_kv_heads));
  p->set_head_dim(static_cast<int32_t>(g.head_dim));
  p->set_block_size(static_cast<int32_t>(g.block_size));
  p->set_bytes_per_element(static_cast<int32_t>(g.bytes_per_element()));
  p->set_dtype(ToProto(g.dtype));
}

std::string KvIncompatibility(const KvEndpointInfo& s, const KvEndpointInfo& r) {
  if (s.model_fingerprint != r.model_fingerprint) {
    return absl::StrCat("model fingerprint differs (sender ", s.model_fingerprint, ", receiver ",
                        r.model_fingerprint, ")");
  }
  const KvCacheGeometry &a = s.geometry, &b = r.geometry;
  if (a.num_layers != b.num_layers || a.num_kv_heads != b.num_kv_heads ||
      a.head_dim != b.head_dim || a.block_size != b.block_size || a.dtype != b.dtype) {
    return absl::StrCat("KV geometry differs (sender layers=", a.num_layers,
                        " kv_heads=", a.num_kv_heads, " head_dim=", a.head_dim,
                        " block_size=", a.block_size, " dtype=", std::string(DTypeName(a.dtype)),
                        "; receiver layers=", b.num_layers, " kv_heads=", b.num_kv_heads,
                        " head_dim=", b.head_dim, " block_size=", b.block_size,
                        " dtype=", std::string(DTypeName(b.dtype)),
                        "; give both workers the same --kv-cache-dtype and --compute-dtype)");
  }
  return "";
}

// ---------------------------------------------------------------- receiver

absl::StatusOr<std::unique_ptr<KvControlReceiver>> KvControlReceiver::Create(
    const Options& options) {
  if (options.storage == nullptr)
    return absl::InvalidArgumentError("KvControlReceiver needs a KV storage");
  std::unique_ptr<KvControlReceiver> r(new KvControlReceiver(options));
  r->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (r->listen_fd_ < 0) return KvSocketError("socket");
  int one = 1;
  setsockopt(r->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  if (inet_pton(AF_INET, options.host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV receiver: '", options.host, "' is not an IPv4 address"));
  }
  if (::bind(r->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0)
    return KvSocketError("bind");
  if (::listen(r->listen_fd_, 64) < 0) return KvSocketError("listen");
  socklen_t len = sizeof(addr);
  getsockname(r->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  r->port_ = ntohs(addr.sin_port);
  r->accept_thread_ = std::thread([p = r.get()] { p->AcceptLoop(); });
  return r;
}

KvControlReceiver::~KvControlReceiver() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  ::close(listen_fd_);
  absl::flat_hash_map<int64_t, std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (int fd : connection_fds_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(connection_threads_);
  }
  for (auto& [connection, t] : threads) t.join();
}

void KvControlReceiver::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    SetTimeouts(fd, options_.io_timeout);
    std::vector<std::thread> ended;  // connections' threads that have returned or are about to
    {
      absl::MutexLock lock(&mu_);
      for (int64_t c : ended_connections_) {
        ended.push_back(std::move(connection_threads_[c]));
        connection_threads_.erase(c);
      }
      ended_connections_.clear();
      connection_fds_.push_back(fd);
      const int64_t connection = next_connection_++;
      connection_threads_[connection] =
          std::thread([this, fd, connection] { ServeConnection(fd, connection); });
    }
    for (auto& t : ended) t.join();
  }
}

void KvControlReceiver::Fail(const std::string& id, const std::string& error) {
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(id);
    if (it == transfers_.end() || it->second.done || it->second.failed) return;
    it->second.failed = true;
    it->second.error = error;
    changed_.SignalAll();
  }
  if (on_complete_) on_complete_(id);
}

bool KvControlReceiver::HoldsLiveTransfer(const std::vector<std::string>& open,
                                          int64_t connection) {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : open) {
    auto it = transfers_.find(id);
    if (it != transfers_.end() && it->second.OwnedBy(connection)) return true;
  }
  return false;
}

void KvControlReceiver::ServeConnection(int fd, int64_t connection) {
  KvStream stream(fd);            // closes the socket when this returns
  std::vector<std::string> open;  // transfers begun on this connection and not ended
  // Transfers begun here without their reservation's capability (their End is refused), and
  // whether that was logged.
  absl::flat_hash_set<std::string> refused;
  bool warned = false;
  auto finish = [&](const absl::Status& s) {
    for (const std::string& id : open) {
      bool mine;  // not taken over by a retry on another connection meanwhile
      {
        absl::MutexLock lock(&mu_);
        auto it = transfers_.find(id);
        mine = it != transfers_.end() && it->second.connection == connection;
        if (mine && options_.keep_reservation_on_sender_loss && !it->second.done) {
          it->second.layers_received = 0;
          it->second.connection = -1;
        }
      }
      if (mine && !options_.keep_reservation_on_sender_loss) Fail(id, std::string(s.message()));
    }
    {
      absl::MutexLock lock(&mu_);
      std::erase(connection_fds_, fd);
      ended_connections_.push_back(connection);
    }
    stream.Close();  // before the link is torn down (on return), as the sender expects
  };
  if (options_.tls != nullptr) {
    if (absl::Status s = stream.StartTls(options_.tls.get(), /*server=*/true); !s.ok()) {
      // Logged for the first few strangers, then every hundredth (a peer cannot flood the log).
      const int64_t n = ++tls_refusals_;
      if (n <= 5 || n % 100 == 0) {
        TANDEM_LOG(WARNING) << "KV connection " << connection << " refused (" << n
                            << " so far): " << s.message();
      }
      return finish(s);
    }
  }
  v1::KvHandshake hello;
  if (absl::Status s = ReadMessage(stream, kHandshake, &hello); !s.ok()) return finish(s);
  KvEndpointInfo sender;
  sender.model_fingerprint = hello.model_fingerprint();
  sender.geometry = {hello.geometry().num_layers(), 0, hello.geometry().block_size(),
                     hello.geometry().num_kv_heads(), hello.geometry().head_dim()};
  const std::optional<DType> dtype = KvDTypeFromProto(hello.geometry());
  v1::KvHandshakeReply reply;
  std::string why;
  if (!dtype.has_value()) {
    why = absl::StrCat("the sender's KV cache type (", static_cast<int>(hello.geometry().dtype()),
                       ", ", hello.geometry().bytes_per_element(),
                       "-byte elements) is not one this worker knows");
  } else {
    sender.geometry.dtype = *dtype;
    why = KvIncompatibility(sender, options_.info);
  }
  std::string rendezvous;  // set when the layers travel over a side link
  KvLinkFactory* factory = nullptr;
  if (why.empty() && !hello.data_path().empty()) {
    std::string offered;
    for (KvLinkFactory* f : options_.link_factories) {
      if (f->name() == hello.data_path()) factory = f;
      absl::StrAppend(&offered, "'", f->name(), "', ");
    }
    if (factory == nullptr) {
      why = absl::StrCat("this decode worker does not offer the '", hello.data_path(),
                         "' KV data path (it offers ", offered, "inline TCP)");
    } else if (absl::StatusOr<std::string> r = factory->NewRendezvous(); !r.ok()) {
      why = absl::StrCat("cannot set up the ", hello.data_path(),
                         " KV data path: ", r.status().message());
    } else {
      rendezvous = *std::move(r);
    }
    reply.set_data_path_refused(!why.empty());
  }
  reply.set_accepted(why.empty());
  reply.set_reason(why);
  reply.set_link_rendezvous(rendezvous);
  if (absl::Status s = SendMessage(stream, kHandshakeReply, reply); !s.ok() || !why.empty()) {
    // A rendezvous the sender never heard of: nobody will join it.
    if (!rendezvous.empty()) factory->Abandon(rendezvous, {0, 1});
    return finish(s.ok() ? absl::FailedPreconditionError(why) : s);
  }
  std::unique_ptr<KvLink> link;
  if (!rendezvous.empty()) {
    absl::StatusOr<std::unique_ptr<KvLink>> joined =
        factory->Join(rendezvous, 1, options_.io_timeout);
    if (!joined.ok()) {
      factory->Abandon(rendezvous, {0});  // this end joined (and left); the sender did not
      return finish(joined.status());
    }
    link = *std::move(joined);
  }
  const KvCacheGeometry& g = options_.storage->geometry();
  const size_t block_bytes = static_cast<size_t>(g.bytes_per_block());
  std::vector<char> payload;
  absl::Time last_frame = absl::Now();
  while (!stopping_) {
    // The next frame may be long in coming: a sender caches its connection between requests, and a
    // long prompt computes between a transfer's frames. So the wait for it has no timeout while a
    // transfer begun here waits for it (a reservation's own timeout bounds a transfer), and
    // idle_timeout otherwise; io_timeout bounds the reading of a frame begun.
    const int ready = stream.PollReadable(100);
    if (ready == 0 || (ready < 0 && errno == EINTR)) {
      // A last look at the socket: a frame that arrived meanwhile keeps the connection. (A Begin
      // still on its way may meet the close; that transfer then fails, and the router may retry its
      // prefill.)
      if (absl::Now() - last_frame >= options_.idle_timeout &&
          !HoldsLiveTransfer(open, connection) && stream.PollReadable(0) == 0) {
        TANDEM_LOG(INFO) << "closing KV connection " << connection << ": nothing arrived for "
                         << absl::FormatDuration(options_.idle_timeout)
                         << (link != nullptr ? " (its link with it)" : "");
        return finish(absl::UnavailableError("the connection was idle"));
      }
      continue;
    }
    if (ready < 0) return finish(KvSocketError("poll"));
    FrameType type;
    uint32_t len;
    if (absl::Status s = ReadHeader(stream, &type, &len); !s.ok()) return finish(s);
    last_frame = absl::Now();
    if (type == kBegin || type == kEnd || type == kLayerHeader) {
      if (len > kMaxControlFrame) return finish(absl::DataLossError("oversized control frame"));
      std::string bytes(len, '\0');
      if (absl::Status s = stream.Read(bytes.data(), len); !s.ok()) return finish(s);
      if (type == kBegin) {
        v1::KvTransferBegin m;
        if (!m.ParseFromString(bytes)) return finish(absl::DataLossError("malformed begin"));
        open.push_back(m.request_id());
        absl::MutexLock lock(&mu_);
        auto it = transfers_.find(m.request_id());
        if (it != transfers_.end() && !it->second.done) {
          if (!KvCapabilityMatches(it->second.capability, m.capability())) {
            // Not this reservation's sender: it takes nothing over, its data is dropped, and its
            // End is refused. Logged once a connection (a peer cannot flood the log).
            refused.insert(m.request_id());
            if (!warned) {
              TANDEM_LOG(WARNING) << "KV connection " << connection
                                  << ": a transfer without its reservation's capability, refused";
              warned = true;
            }
            continue;
          }
          it->second.layers_received = 0;
          it->second.connection = connection;
        }
        continue;
      }
      if (type == kEnd) {
        v1::KvTransferEnd m;
        if (!m.ParseFromString(bytes)) return finish(absl::DataLossError("malformed end"));
        std::erase(open, m.request_id());
        v1::KvTransferAck ack;
        ack.set_request_id(m.request_id());
        bool notify = false;
        {
          absl::MutexLock lock(&mu_);
          auto it = transfers_.find(m.request_id());
          if (refused.erase(m.request_id()) > 0) {
            ack.set_error("the transfer did not present the reservation's KV capability");
          } else if (it == transfers_.end()) {
            ack.set_error("no reservation (cancelled or never expected)");
          } else if (it->second.connection != connection && !it->second.failed) {
            ack.set_error("the transfer was not begun on this connection (a retry took it over)");
          } else if (it->second.failed) {
            ack.set_error(it->second.error);
          } else if (it->second.layers_received != g.num_layers) {
            it->second.failed = true;
            it->second.error = absl::StrCat("transfer ended after ", it->second.layers_received,
                                            " of ", g.num_layers, " layers");
            ack.set_error(it->second.error);
            notify = true;
          } else {
            it->second.done = true;
            it->second.first_token = m.first_token();
            ack.set_ok(true);
            notify = true;
          }
          changed_.SignalAll();
        }
        if (notify && on_complete_) on_complete_(m.request_id());
        if (absl::Status s = SendMessage(stream, kAck, ack); !s.ok()) return finish(s);
        continue;
      }
      // Layer header, then its payload frame. The payload size is checked against the header and
      // the pool before anything is allocated: a hostile peer cannot make us allocate at will.
      v1::KvLayerHeader h;
      if (!h.ParseFromString(bytes)) return finish(absl::DataLossError("malformed layer header"));
      const uint64_t expected =
          2ull * static_cast<uint64_t>(std::max(h.num_blocks(), 0)) * block_bytes;
      if (h.num_blocks() < 0 || h.num_blocks() > g.num_blocks ||
          static_cast<uint64_t>(h.payload_bytes()) != expected) {
        return finish(absl::DataLossError("layer header does not match the cache geometry"));
      }
      if (link != nullptr) {  // no payload frame: the layer moves over the link
        if (absl::Status s = ReceiveLayerOverLink(link.get(), connection, h.request_id(), h.layer(),
                                                  h.num_blocks());
            !s.ok()) {
          return finish(s);
        }
        continue;
      }
      FrameType ptype;
      uint32_t plen;
      if (absl::Status s = ReadHeader(stream, &ptype, &plen); !s.ok()) return finish(s);
      if (ptype != kLayerPayload || plen != expected) {
        return finish(absl::DataLossError("layer payload does not match its header"));
      }
      bool wanted;
      {
        absl::MutexLock lock(&mu_);
        auto it = transfers_.find(h.request_id());
        wanted = it != transfers_.end() && it->second.OwnedBy(connection);
      }
      if (!wanted) {  // cancelled, unknown or another connection's: drain the payload without
                      // keeping it
        char scratch[1 << 16];
        for (uint64_t left = plen; left > 0;) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(left, sizeof(scratch)));
          if (absl::Status s = stream.Read(scratch, n); !s.ok()) return finish(s);
          left -= n;
        }
        continue;
      }
      payload.resize(plen);
      if (absl::Status s = stream.Read(payload.data(), plen); !s.ok()) return finish(s);
      absl::ReleasableMutexLock lock(&mu_);
      auto it = transfers_.find(h.request_id());
      if (it == transfers_.end() || !it->second.OwnedBy(connection)) {
        continue;  // cancelled or taken over meanwhile
      }
      Transfer& t = it->second;
      if (h.layer() < 0 || h.layer() >= g.num_layers ||
          h.num_blocks() != static_cast<int32_t>(t.blocks.size())) {
        const std::string error =
            absl::StrCat("layer ", h.layer(), " with ", h.num_blocks(),
                         " blocks does not fit the reservation of ", t.blocks.size(), " blocks");
        lock.Release();
        Fail(h.request_id(), error);
        continue;
      }
      // Host or device memory alike (a memcpy per block on the CPU); complete when it returns.
      options_.storage->WriteBlocks(false, h.layer(), t.blocks, payload.data());
      options_.storage->WriteBlocks(true, h.layer(), t.blocks,
                                    payload.data() + t.blocks.size() * block_bytes);
      ++t.layers_received;
    } else {
      return finish(absl::DataLossError(absl::StrCat("unexpected frame type ", type)));
    }
  }
  finish(absl::UnavailableError("receiver shutting down"));
}

absl::Status KvControlReceiver::ReceiveLayerOverLink(KvLink* link, int64_t connection,
                                                     const std::string& id, int32_t layer,
                                                     int32_t num_blocks) {
  std::vector<int32_t> blocks;  // empty: not wanted
  std::string misfit;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(id);
    if (it != transfers_.end() && it->second.OwnedBy(connection)) {
      const Transfer& t = it->second;
      if (layer < 0 || layer >= options_.storage->geometry().num_layers ||
          num_blocks != static_cast<int32_t>(t.blocks.size()) || num_blocks == 0) {
        misfit =
            absl::StrCat("layer ", layer, " with ", num_blocks,
                         " blocks does not fit the reservation of ", t.blocks.size(), " blocks");
      } else {
        blocks = t.blocks;
      }
    }
  }
  if (!misfit.empty()) Fail(id, misfit);
  if (blocks.empty()) return link->DiscardLayer(num_blocks, options_.io_timeout);
  // Each piece goes into the blocks under mu_, and only while they are still this transfer's:
  // Cancel and Wait may then release them at once, whatever the link is doing.
  bool landed_all = true;
  const KvLink::Landing land = [&](const std::function<void()>& write) {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(id);
    if (it != transfers_.end() && it->second.OwnedBy(connection) && it->second.blocks == blocks) {
      write();
    } else {
      landed_all = false;
    }
  };
  RETURN_IF_ERROR(link->RecvLayer(layer, blocks, land, options_.io_timeout));
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (landed_all && it != transfers_.end() && it->second.OwnedBy(connection))
    ++it->second.layers_received;
  return absl::OkStatus();
}

absl::Status KvControlReceiver::Expect(const std::string& request_id,
                                       std::vector<int32_t> dst_blocks,
                                       const std::string& capability) {
  const int64_t n = options_.storage->geometry().num_blocks;
  for (int32_t b : dst_blocks) {
    if (b < 0 || b >= n)
      return absl::InvalidArgumentError(absl::StrCat("block ", b, " outside the pool"));
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = transfers_.try_emplace(request_id);
  if (!inserted)
    return absl::AlreadyExistsError(
        absl::StrCat("a transfer for \"", request_id, "\" is already expected"));
  it->second.blocks = std::move(dst_blocks);
  it->second.capability = capability;
  return absl::OkStatus();
}

absl::StatusOr<int32_t> KvControlReceiver::Wait(const std::string& request_id,
                                                absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    auto it = transfers_.find(request_id);
    if (it == transfers_.end())
      return absl::NotFoundError(absl::StrCat("no transfer expected for \"", request_id, "\""));
    if (it->second.done) {
      const int32_t token = it->second.first_token;
      transfers_.erase(it);
      return token;
    }
    if (it->second.failed) {
      const std::string error = it->second.error;
      transfers_.erase(it);
      return absl::UnavailableError(
          absl::StrCat("KV transfer of \"", request_id, "\" failed: ", error));
    }
    if (changed_.WaitWithDeadline(&mu_, deadline)) {
      transfers_.erase(request_id);
      return absl::DeadlineExceededError(
          absl::StrCat("KV transfer of \"", request_id, "\" did not complete in time"));
    }
  }
}

void KvControlReceiver::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  transfers_.erase(request_id);
  changed_.SignalAll();
}

// ---------------------------------------------------------------- sender

absl::StatusOr<std::unique_ptr<KvControlSender>> KvControlSender::Connect(
    const std::string& address, const KvEndpointInfo& info, absl::Duration io_timeout,
    KvLinkFactory* link_factory, KvTls* tls) {
  return ConnectFirst(address, info, io_timeout, {link_factory}, nullptr, tls);
}

absl::StatusOr<std::unique_ptr<KvControlSender>> KvControlSender::ConnectFirst(
    const std::string& address, const KvEndpointInfo& info, absl::Duration io_timeout,
    const std::vector<KvLinkFactory*>& paths, std::string* refused, KvTls* tls) {
  if (paths.empty()) return absl::InvalidArgumentError("no KV data path to try");
  std::string reasons;
  absl::Status last;
  for (KvLinkFactory* path : paths) {
    bool path_failed = false;
    absl::StatusOr<std::unique_ptr<KvControlSender>> sender =
        Open(address, info, io_timeout, path, tls, &path_failed);
    if (sender.ok()) {
      if (refused != nullptr) *refused = reasons;
      return sender;
    }
    last = sender.status();
    absl::StrAppend(&reasons, reasons.empty() ? "" : "; ",
                    path != nullptr ? path->name() : "inline", ": ", last.message());
    if (!path_failed)
      break;  // unreachable, or this sender's model or geometry refused: no path helps
  }
  return absl::Status(last.code(), paths.size() > 1
                                       ? absl::StrCat("no KV data path worked (", reasons, ")")
                                       : std::string(last.message()));
}

absl::StatusOr<std::unique_ptr<KvControlSender>> KvControlSender::Open(
    const std::string& target, const KvEndpointInfo& info, absl::Duration io_timeout,
    KvLinkFactory* link_factory, KvTls* tls, bool* path_failed) {
  *path_failed = false;
  const bool tls_address = absl::StartsWith(target, kKvTlsScheme);
  const std::string address = tls_address ? target.substr(strlen(kKvTlsScheme)) : target;
  if (tls_address && tls == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the KV receiver at ", address,
        " accepts only TLS: give this worker the cluster's "
        "--tls-cert-file, --tls-key-file and --tls-ca-file (with --kv-tls, the default)"));
  }
  if (!tls_address && tls != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker sends KV only over TLS (--kv-tls with its --tls-* files), and the KV receiver "
        "at ",
        address, " is plaintext: give it the same --tls-* files, or --kv-tls=false to both"));
  }
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV receiver address '", address, "' is not host:port"));
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(address.substr(0, colon).c_str(), address.substr(colon + 1).c_str(), &hints,
                  &res) != 0 ||
      !res) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", address));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SetTimeouts(fd, io_timeout);
  const int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc < 0) {
    absl::Status s = KvSocketError("connect");
    ::close(fd);
    return s;
  }
  auto stream = std::make_unique<KvStream>(fd);
  if (tls != nullptr) {
    if (absl::Status s = stream->StartTls(tls, /*server=*/false); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("KV connection to ", address, ": ", s.message()));
    }
  }
  std::unique_ptr<KvControlSender> sender(new KvControlSender(std::move(stream), info, io_timeout));
  KvStream& stream_ref = *sender->stream_;
  v1::KvHandshake hello;
  hello.set_model_fingerprint(info.model_fingerprint);
  KvGeometryToProto(info.geometry, hello.mutable_geometry());
  if (link_factory != nullptr) hello.set_data_path(link_factory->name());
  RETURN_IF_ERROR(SendMessage(stream_ref, kHandshake, hello));
  v1::KvHandshakeReply reply;
  RETURN_IF_ERROR(ReadMessage(stream_ref, kHandshakeReply, &reply));
  if (!reply.accepted()) {
    *path_failed = reply.data_path_refused();
    return absl::FailedPreconditionError(
        absl::StrCat("KV receiver at ", address, " refused: ", reply.reason()));
  }
  *path_failed = true;  // from here on only the data path can fail
  if (link_factory != nullptr) {
    if (reply.link_rendezvous().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV receiver at ", address, " did not set up the ", link_factory->name(),
                       " data path (an older version?)"));
    }
    absl::StatusOr<std::unique_ptr<KvLink>> link =
        link_factory->Join(reply.link_rendezvous(), 0, io_timeout);
    if (!link.ok()) {
      return absl::Status(link.status().code(),
                          absl::StrCat("KV transfer to ", address, ": joining the ",
                                       link_factory->name(), " link: ", link.status().message()));
    }
    sender->link_ = *std::move(link);
    sender->data_path_ = link_factory->name();
  }
  return sender;
}

KvControlSender::~KvControlSender() {
  // The connection first: a side link's teardown waits for the receiver to let go of it (CUDA IPC:
  // unmap the staging), which the receiver does when it sees the connection close.
  stream_->Close();
}

absl::Status KvControlSender::Begin(const std::string& request_id, int64_t num_tokens,
                                    const std::string& capability) {
  v1::KvTransferBegin m;
  m.set_request_id(request_id);
  m.set_num_tokens(num_tokens);
  m.set_capability(capability);
  return Io(SendMessage(*stream_, kBegin, m));
}

absl::Status KvControlSender::SendLayer(const std::string& request_id, int32_t layer,
                                        const std::vector<int32_t>& src_blocks,
                                        KvCacheStorage* storage, WorkMark* ready) {
  const KvCacheGeometry& g = storage->geometry();
  if (layer < 0 || layer >= g.num_layers) return absl::InvalidArgumentError("layer out of range");
  const size_t block_bytes = static_cast<size_t>(g.bytes_per_block());
  for (int32_t b : src_blocks) {
    if (b < 0 || b >= g.num_blocks) return absl::InvalidArgumentError("block out of range");
  }
  const size_t payload = 2 * src_blocks.size() * block_bytes;
  if (payload > std::numeric_limits<uint32_t>::max())
    return absl::InvalidArgumentError("layer payload over 4 GiB");
  // The layer's KV writes first, before any byte of the layer goes out: the receiver, once a frame
  // has begun, reads the rest of it under its io timeout. (A failed wait leaves the connection
  // sound.)
  if (ready != nullptr) RETURN_IF_ERROR(ready->Wait(absl::Now() + io_timeout_));
  if (link_ == nullptr && !storage->host_accessible()) {
    // Device memory: copy the layer out first, after its KV writes (the mark above; without one,
    // after all the work enqueued by now); the blocks stay the request's until End(). This comes
    // before the layer's header: the receiver, once a frame has begun, reads the rest of it under
    // its io timeout.
    staging_.resize(payload);
    storage->ReadBlocks(false, layer, src_blocks, staging_.data(),
                        /*after_enqueued_work=*/ready == nullptr);
    storage->ReadBlocks(true, layer, src_blocks, staging_.data() + src_blocks.size() * block_bytes,
                        ready == nullptr);
  }
  v1::KvLayerHeader h;
  h.set_request_id(request_id);
  h.set_layer(layer);
  h.set_num_blocks(static_cast<int32_t>(src_blocks.size()));
  h.set_payload_bytes(static_cast<int64_t>(payload));
  RETURN_IF_ERROR(Io(SendMessage(*stream_, kLayerHeader, h)));
  if (link_ != nullptr) return Io(link_->SendLayer(layer, src_blocks, io_timeout_, ready));
  // The payload goes out from the staging copy, or straight from host cache blocks (K blocks, then
  // V blocks): the sender's blocks stay allocated until End() returns.
  unsigned char header[5];
  const uint32_t len = static_cast<uint32_t>(payload);
  std::memcpy(header, &len, 4);
  header[4] = kLayerPayload;
  iov_.clear();
  iov_.push_back({header, sizeof(header)});
  if (!storage->host_accessible()) {
    iov_.push_back({staging_.data(), payload});
    return Io(stream_->WriteVector(iov_));
  }
  for (bool v : {false, true}) {
    std::byte* base = storage->layer_data(v, layer);
    for (int32_t b : src_blocks) iov_.push_back({base + b * block_bytes, block_bytes});
  }
  return Io(stream_->WriteVector(iov_));
}

absl::Status KvControlSender::End(const std::string& request_id, int32_t first_token) {
  v1::KvTransferEnd m;
  m.set_request_id(request_id);
  m.set_first_token(first_token);
  RETURN_IF_ERROR(Io(SendMessage(*stream_, kEnd, m)));
  v1::KvTransferAck ack;
  RETURN_IF_ERROR(Io(ReadMessage(*stream_, kAck, &ack)));
  if (!ack.ok())
    return absl::UnavailableError(
        absl::StrCat("KV receiver rejected \"", request_id, "\": ", ack.error()));
  return absl::OkStatus();
}

absl::Status KvControlSender::Io(absl::Status s) {
  if (!s.ok()) broken_ = true;
  return s;
}

bool KvControlSender::Connected() const {
  if (broken_) return false;
  // The receiver only ever writes an acknowledgement, which End reads at once: between jobs a
  // readable (or hung-up) socket is one the receiver closed or reset.
  return stream_->PollReadable(0) == 0;
}

}  // namespace tandem
