// The byte stream under a KV control connection (kv_control.h): a TCP socket, plaintext or wrapped
// in TLS (TLS 1.3, mutual: each end presents a certificate that must chain to the cluster's CA).
//
// KV TLS is the workers' choice (KvTlsFromFlags): with --tls-cert-file, --tls-key-file and
// --tls-ca-file set and --kv-tls true (the default), a decode worker's KV receiver accepts only TLS
// connections from senders holding a cluster certificate, and advertises its address as
// "tls://host:port"; a prefill worker with KV TLS sends only to such addresses, and one without it
// refuses them with a message naming the flags. Off, or without certificates, the connections are
// plaintext (a private network's choice: docs/security.md has the trade-off, docs/benchmarks.md the
// cost). Either way a transfer needs its reservation's capability. Side data paths (NCCL, CUDA IPC)
// carry layers outside this stream and are not encrypted by it.
//
// A stream has one reader and one writer at a time (the connection's thread); timeouts are the
// socket's (SO_RCVTIMEO/SO_SNDTIMEO): a silent peer fails a read or write with DEADLINE_EXCEEDED.
#pragma once

#include <sys/uio.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace tandem {

// TLS contexts of one process for KV connections, from PEM files re-read when they change (checked
// at most every `refresh`; connections open keep what they were opened with). Thread-safe.
class KvTls {
 public:
  struct Files {
    std::string cert_file;  // this process's certificate chain
    std::string key_file;
    std::string ca_file;  // peers' certificates must chain to it (both ways)
    absl::Duration refresh = absl::Seconds(10);
  };
  // INVALID_ARGUMENT when a file is missing or unreadable, or not PEM of the right kind.
  static absl::StatusOr<std::shared_ptr<KvTls>> Create(const Files& files);
  ~KvTls();

  // The context to open a connection with: as the connecting end (client) or the accepting one.
  std::shared_ptr<SSL_CTX> Context(bool server) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit KvTls(Files files) : files_(std::move(files)) {}
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Stamp() const;  // the files' sizes and modification times

  const Files files_;
  absl::Mutex mu_;
  std::shared_ptr<SSL_CTX> client_ ABSL_GUARDED_BY(mu_), server_ ABSL_GUARDED_BY(mu_);
  std::string stamp_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// This process's KV TLS from its flags (--kv-tls and the --tls-* files): null when off. With
// --kv-tls true and a certificate but no CA (or the reverse), INVALID_ARGUMENT: mutual TLS needs
// all three files.
absl::StatusOr<std::shared_ptr<KvTls>> KvTlsFromFlags();

// A failed socket call `what` of a KV connection, from errno: DEADLINE_EXCEEDED for a socket
// timeout (EAGAIN), UNAVAILABLE otherwise.
absl::Status KvSocketError(const char* what);

// The scheme prefix of a TLS KV address ("tls://host:port").
inline constexpr char kKvTlsScheme[] = "tls://";

class KvStream {
 public:
  // Plaintext over `fd`, which the stream owns (closed by the destructor).
  explicit KvStream(int fd) : fd_(fd) {}
  ~KvStream() { Close(); }
  KvStream(const KvStream&) = delete;
  KvStream& operator=(const KvStream&) = delete;

  // Runs the TLS handshake over the socket, as the accepting end (`server`) or the connecting one,
  // and verifies the peer's certificate against the CA. UNAUTHENTICATED when the peer has no
  // certificate from the CA, UNAVAILABLE / DEADLINE_EXCEEDED when the connection fails.
  absl::Status StartTls(KvTls* tls, bool server);
  bool tls() const { return ssl_ != nullptr; }
  int fd() const { return fd_; }

  absl::Status Write(const void* data, size_t n);
  // Writes every buffer of `iov` (consumed as it goes).
  absl::Status WriteVector(std::vector<iovec>& iov);
  absl::Status Read(void* data, size_t n);
  // Whether something can be read (bytes, or the peer's close) within `timeout_ms`: 1 yes, 0 no,
  // -1 error.
  int PollReadable(int timeout_ms) const;
  // Ends the connection (TLS close_notify when it is healthy) and closes the socket; the peer sees
  // it closed. Idempotent; nothing may be read or written afterwards.
  void Close();

 private:
  absl::Status TlsError(const char* what, int rc);
  absl::Status SslWrite(const void* data, size_t n);

  int fd_;
  SSL* ssl_ = nullptr;
  bool handshaken_ = false;     // TLS: the handshake completed
  bool failed_ = false;         // TLS: a fatal error or a timeout: no close_notify at the end
  std::vector<char> coalesce_;  // TLS: small buffers gathered into full records
};

}  // namespace tandem
