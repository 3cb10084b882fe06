// libFuzzer target: what a peer on a decode worker's KV port sends (common/transport/kv_control.h).
// A receiver on loopback over a small CPU cache holds one reservation (blocks 1 and 4, capability
// kCapability); each input is a script of frames written to a fresh connection: handshakes right
// and wrong, Begins with the capability or without, layer headers and payloads that fit or not,
// Ends, raw frames of any type and length, and raw bytes. The receiver must not crash, must close
// the connection once the input ends, must never write outside the reservation — nor into it
// unless the bytes sent carry the capability — and protobuf must not log on the way (its UTF-8
// complaints were a line per frame a peer could make the worker write: the fields are bytes now).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/kv_cache_storage.h"
#include "common/rpc/dtype_proto.h"
#include "common/transport/kv_control.h"
#include "google/protobuf/stubs/logging.h"
#include "tandem/v1/kv_transfer.pb.h"

namespace {

using tandem::KvCacheGeometry;

constexpr char kCapability[] = "0123456789abcdef0123456789abcdef";
constexpr char kFingerprint[] = "fuzz-model";
const std::vector<int32_t> kReserved = {1, 4};
constexpr unsigned char kSentinel = 0xab;

struct Receiver {
  std::unique_ptr<tandem::CpuBackend> backend;
  std::unique_ptr<tandem::KvCacheStorage> storage;
  std::unique_ptr<tandem::KvControlReceiver> receiver;
  KvCacheGeometry g;
};

// Whether protobuf logged (a line a hostile peer could make the worker write per frame).
std::atomic<bool> protobuf_logged{false};
void OnProtobufLog(google::protobuf::LogLevel, const char*, int, const std::string& message) {
  std::fprintf(stderr, "kv_frames: protobuf logged: %s\n", message.c_str());
  protobuf_logged = true;
}

Receiver& TheReceiver() {
  // Destroyed at exit: the receiver joins its connections' threads (a thread left unjoined is a
  // leak to ThreadSanitizer).
  static std::unique_ptr<Receiver> r = [] {
    std::signal(SIGPIPE, SIG_IGN);  // the receiver may close before the input is written
    google::protobuf::SetLogHandler(OnProtobufLog);
    auto x = std::make_unique<Receiver>();
    x->backend = tandem::CpuBackend::Create({}).value();
    x->g = {/*num_layers=*/2, /*num_blocks=*/6, /*block_size=*/2, /*num_kv_heads=*/1,
            /*head_dim=*/4};
    x->storage = tandem::KvCacheStorage::Create(x->backend.get(), x->g).value();
    tandem::KvControlReceiver::Options o{
        "127.0.0.1", 0, x->storage.get(), {kFingerprint, x->g}, absl::Milliseconds(200)};
    x->receiver = tandem::KvControlReceiver::Create(o).value();
    return x;
  }();
  return *r;
}

char* Bytes(Receiver& r, bool v) {
  return static_cast<char*>(v ? r.storage->v_data() : r.storage->k_data());
}

// Reads the input front to back; past its end every read is 0.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::string Take(size_t n) {
    n = std::min(n, size_ - std::min(pos_, size_));
    std::string s(reinterpret_cast<const char*>(data_) + pos_, n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

void Frame(std::string* wire, uint8_t type, const std::string& payload) {
  const uint32_t len = static_cast<uint32_t>(payload.size());
  wire->append(reinterpret_cast<const char*>(&len), 4);
  wire->push_back(static_cast<char>(type));
  *wire += payload;
}

std::string Handshake(const KvCacheGeometry& g, uint8_t variant) {
  tandem::v1::KvHandshake h;
  h.set_model_fingerprint(variant == 1 ? "another-model" : kFingerprint);
  tandem::KvCacheGeometry sent = g;
  if (variant == 2) sent.num_layers += 1;
  if (variant == 3) sent.head_dim = 0;
  tandem::KvGeometryToProto(sent, h.mutable_geometry());
  if (variant == 4) h.mutable_geometry()->set_dtype(static_cast<tandem::v1::WeightDType>(99));
  if (variant == 5) h.set_data_path("nccl");  // not offered here
  return h.SerializeAsString();
}

std::string RequestId(uint8_t b) { return b % 4 == 0 ? "x" : b % 4 == 1 ? "" : "r"; }

std::string Capability(Input& in) {
  switch (in.Byte() % 4) {
    case 0: return kCapability;
    case 1: {
      std::string c = kCapability;
      c[in.Byte() % c.size()] ^= 1;
      return c;
    }
    case 2: return "";
    default: return in.Take(in.Byte() % 40);
  }
}

// A layer header for `layer` of `blocks` blocks, then its payload (of the size it states, filled
// from the input).
void Layer(std::string* wire, Input& in, const KvCacheGeometry& g, const std::string& id,
           int32_t layer, int32_t blocks, bool honest) {
  tandem::v1::KvLayerHeader h;
  h.set_request_id(id);
  h.set_layer(layer);
  h.set_num_blocks(blocks);
  const int64_t bytes = 2 * static_cast<int64_t>(std::max(blocks, 0)) * g.bytes_per_block();
  h.set_payload_bytes(honest ? bytes : static_cast<int64_t>(in.Byte()) * 8);
  Frame(wire, 4, h.SerializeAsString());
  std::string payload(static_cast<size_t>(honest ? bytes : in.Byte() * 8), '\0');
  const std::string fill = in.Take(8);
  for (size_t i = 0; i < payload.size(); ++i)
    payload[i] = fill.empty() ? static_cast<char>(i) : fill[i % fill.size()];
  Frame(wire, honest || in.Byte() % 2 ? 5 : in.Byte(), payload);
}

std::string Compose(Input& in, const KvCacheGeometry& g) {
  std::string wire;
  while (!in.done() && wire.size() < (256 << 10)) {
    const uint8_t op = in.Byte();
    switch (op % 8) {
      case 0: Frame(&wire, 1, Handshake(g, 0)); break;
      case 1: Frame(&wire, 1, Handshake(g, in.Byte() % 6)); break;
      case 2: {
        tandem::v1::KvTransferBegin b;
        b.set_request_id(RequestId(in.Byte()));
        b.set_num_tokens(in.Byte());
        b.set_capability(Capability(in));
        Frame(&wire, 3, b.SerializeAsString());
        break;
      }
      case 3: {  // (the input read in this order, whatever the compiler's for arguments)
        const std::string id = RequestId(in.Byte());
        const int32_t layer = static_cast<int32_t>(in.Byte() % 4) - 1;
        const int32_t blocks = static_cast<int32_t>(in.Byte() % 4);
        Layer(&wire, in, g, id, layer, blocks, in.Byte() % 4 != 0);
        break;
      }
      case 4: {
        tandem::v1::KvTransferEnd e;
        e.set_request_id(RequestId(in.Byte()));
        e.set_first_token(in.Byte());
        Frame(&wire, 6, e.SerializeAsString());
        break;
      }
      case 5: {  // any type, any stated length, whatever bytes follow
        uint32_t len = in.Byte();
        len |= static_cast<uint32_t>(in.Byte()) << (in.Byte() % 25);
        const uint8_t type = in.Byte();
        wire.append(reinterpret_cast<const char*>(&len), 4);
        wire.push_back(static_cast<char>(type));
        wire += in.Take(std::min<uint32_t>(len, 512));
        break;
      }
      case 6: wire += in.Take(in.Byte()); break;
      default: {  // a whole transfer with the capability, as a prefill worker sends it
        tandem::v1::KvTransferBegin b;
        b.set_request_id("r");
        b.set_num_tokens(3);
        b.set_capability(kCapability);
        Frame(&wire, 3, b.SerializeAsString());
        for (int32_t l = 0; l < g.num_layers; ++l) Layer(&wire, in, g, "r", l, 2, true);
        tandem::v1::KvTransferEnd e;
        e.set_request_id("r");
        e.set_first_token(7);
        Frame(&wire, 6, e.SerializeAsString());
        break;
      }
    }
  }
  return wire;
}

// Writes `wire` to a new connection, then reads until the receiver closes it (false: it did not
// within 30 s).
bool Exchange(int port, const std::string& wire) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  timeval tv{30, 0};  // a hang, not a slow machine (a libFuzzer run beside a build took > 5 s)
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("kv_frames: connect");
    std::abort();
  }
  for (size_t done = 0; done < wire.size();) {
    const ssize_t n = ::send(fd, wire.data() + done, wire.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;  // libFuzzer's timer signal
    if (n <= 0) break;                      // the receiver closed: the rest is not read
    done += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0 || (n < 0 && errno == EINTR)) {
  }
  const int error = errno;
  const bool closed = n == 0 || (n < 0 && error == ECONNRESET);
  if (!closed) std::fprintf(stderr, "kv_frames: recv: %s\n", std::strerror(error));
  ::close(fd);
  return closed;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Receiver& r = TheReceiver();
  const int64_t bytes = r.g.num_layers * r.g.bytes_per_layer();
  // The last input's reservation first: its connection wrote under the receiver's lock, which
  // Cancel takes, so the writes are over (and ThreadSanitizer sees them ordered before the reset;
  // the connection's close, which the last Exchange waited for, orders them too, but through the
  // kernel, which it does not see).
  r.receiver->Cancel("r");
  std::memset(Bytes(r, false), kSentinel, bytes);
  std::memset(Bytes(r, true), kSentinel, bytes);
  if (!r.receiver->Expect("r", kReserved, kCapability).ok()) std::abort();
  Input in(data, size);
  const std::string wire = Compose(in, r.g);
  if (!Exchange(r.receiver->port(), wire)) {
    std::fprintf(stderr, "kv_frames: the receiver kept the connection open after the input\n");
    std::abort();
  }
  if (protobuf_logged) std::abort();
  const bool may_write = wire.find(kCapability) != std::string::npos;
  const int64_t block = r.g.bytes_per_block();
  for (int64_t l = 0; l < r.g.num_layers; ++l) {
    for (int32_t b = 0; b < r.g.num_blocks; ++b) {
      const bool reserved = b == kReserved[0] || b == kReserved[1];
      if (reserved && may_write) continue;
      for (bool v : {false, true}) {
        const char* p = Bytes(r, v) + l * r.g.bytes_per_layer() + b * block;
        for (int64_t i = 0; i < block; ++i) {
          if (static_cast<unsigned char>(p[i]) != kSentinel) {
            std::fprintf(stderr, "kv_frames: block %d of layer %lld (%s) written%s\n", b,
                         static_cast<long long>(l), v ? "V" : "K",
                         reserved ? " without the capability" : ", outside the reservation");
            std::abort();
          }
        }
      }
    }
  }
  return 0;
}
