#include "common/transport/kv_stream.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <mutex>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/base/socket_io.h"
#include "common/rpc/tls.h"

ABSL_FLAG(bool, kv_tls, true,
          "KV transfers over TLS (mutual, TLS 1.3) when --tls-cert-file, --tls-key-file and "
          "--tls-ca-file are set; false: plaintext KV connections (a private network's choice)");

namespace tandem {
namespace {

std::string OpenSslErrors() {
  std::string out;
  for (unsigned long e; (e = ERR_get_error()) != 0;) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown TLS error" : out;
}

void FreeContext(SSL_CTX* ctx) { SSL_CTX_free(ctx); }

}  // namespace

absl::Status KvSocketError(const char* what) {
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    return absl::DeadlineExceededError(absl::StrCat("KV transfer: ", what, " timed out"));
  }
  return absl::UnavailableError(absl::StrCat("KV transfer: ", what, ": ", std::strerror(errno)));
}

// ---------------------------------------------------------------------------------------- KvTls

absl::StatusOr<std::shared_ptr<KvTls>> KvTls::Create(const Files& files) {
  if (files.cert_file.empty() || files.key_file.empty() || files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "KV TLS needs a certificate, its key and the CA (--tls-cert-file, --tls-key-file, "
        "--tls-ca-file): both ends of a KV connection verify each other");
  }
  std::shared_ptr<KvTls> tls(new KvTls(files));
  absl::MutexLock lock(&tls->mu_);
  if (absl::Status s = tls->Load(); !s.ok()) return s;
  tls->checked_ = absl::Now();
  return tls;
}

KvTls::~KvTls() = default;

std::string KvTls::Stamp() const {
  std::string stamp;
  for (const std::string* f : {&files_.cert_file, &files_.key_file, &files_.ca_file}) {
    struct stat st {};
    if (::stat(f->c_str(), &st) == 0) {
      absl::StrAppend(&stamp, st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ";");
    } else {
      absl::StrAppend(&stamp, "missing;");
    }
  }
  return stamp;
}

absl::Status KvTls::Load() {
  const std::string stamp = Stamp();
  std::shared_ptr<SSL_CTX> made[2];
  for (int server = 0; server < 2; ++server) {
    ERR_clear_error();
    SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (ctx == nullptr) return absl::InternalError("KV TLS: " + OpenSslErrors());
    made[server] = std::shared_ptr<SSL_CTX>(ctx, FreeContext);
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    // A connection closed without close_notify reads as closed, not as an error; no session
    // tickets: the connecting end sees nothing on its socket between transfers unless the
    // receiver closed it (KvControlSender::Connected).
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    if (server) SSL_CTX_set_num_tickets(ctx, 0);
    if (SSL_CTX_use_certificate_chain_file(ctx, files_.cert_file.c_str()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("KV TLS: cannot use the certificate ",
                                                     files_.cert_file, ": ", OpenSslErrors()));
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, files_.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV TLS: cannot use the key ", files_.key_file, ": ", OpenSslErrors()));
    }
    if (SSL_CTX_load_verify_locations(ctx, files_.ca_file.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV TLS: cannot load the CA ", files_.ca_file, ": ", OpenSslErrors()));
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
                       nullptr);
  }
  client_ = std::move(made[0]);
  server_ = std::move(made[1]);
  stamp_ = stamp;
  return absl::OkStatus();
}

std::shared_ptr<SSL_CTX> KvTls::Context(bool server) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ >= files_.refresh) {
    checked_ = now;
    if (Stamp() != stamp_) {
      // A renewal half written keeps the old contexts until the files make a whole again.
      if (absl::Status s = Load(); !s.ok()) ERR_clear_error();
    }
  }
  return server ? server_ : client_;
}

absl::StatusOr<std::shared_ptr<KvTls>> KvTlsFromFlags() {
  if (!absl::GetFlag(FLAGS_kv_tls)) return std::shared_ptr<KvTls>();
  absl::StatusOr<rpc::TlsOptions> o = rpc::TlsOptionsFromFlags();
  if (!o.ok()) return o.status();
  if (o->cert_file.empty() && o->ca_file.empty()) return std::shared_ptr<KvTls>();
  if (o->cert_file.empty() || o->ca_file.empty()) {
    return absl::InvalidArgumentError(
        "KV transfers over TLS (--kv-tls, on by default) need --tls-cert-file, --tls-key-file and "
        "--tls-ca-file together (mutual TLS); give all three, or --kv-tls=false for plaintext KV "
        "connections on a private network");
  }
  return KvTls::Create({o->cert_file, o->key_file, o->ca_file, absl::Seconds(o->refresh_s)});
}

// ------------------------------------------------------------------------------------- KvStream

void KvStream::Close() {
  if (ssl_ != nullptr) {
    // close_notify, best effort, on a healthy connection only: after a fatal error OpenSSL forbids
    // it, and after a timeout it would block for another one flushing what did not go out.
    if (handshaken_ && !failed_) SSL_shutdown(ssl_);
    ERR_clear_error();
    SSL_free(ssl_);
    ssl_ = nullptr;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

// Whether a failed TLS call was interrupted by a signal and is to be made again with the same
// arguments (OpenSSL's socket BIO reports EINTR as a retry: WANT_READ / WANT_WRITE).
static bool Interrupted(SSL* ssl, int rc) {
  const int err = errno;
  const int e = SSL_get_error(ssl, rc);
  errno = err;
  return (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_SYSCALL) &&
         err == EINTR;
}

absl::Status KvStream::TlsError(const char* what, int rc) {
  const int e = SSL_get_error(ssl_, rc);
  if (e != SSL_ERROR_ZERO_RETURN) failed_ = true;
  switch (e) {
    case SSL_ERROR_ZERO_RETURN:
      return absl::UnavailableError("KV transfer: peer closed the connection");
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:  // a blocking socket's timeout
      ERR_clear_error();
      return absl::DeadlineExceededError(absl::StrCat("KV transfer: ", what, " timed out"));
    case SSL_ERROR_SYSCALL:
      if (errno == 0) return absl::UnavailableError("KV transfer: peer closed the connection");
      return KvSocketError(what);
    default:
      return absl::UnavailableError(absl::StrCat("KV transfer: TLS ", what, ": ", OpenSslErrors()));
  }
}

absl::Status KvStream::StartTls(KvTls* tls, bool server) {
  static std::once_flag sigpipe;
  std::call_once(sigpipe, [] {
    // OpenSSL writes with write(2): a peer gone must be an error, not SIGPIPE.
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL)
      std::signal(SIGPIPE, SIG_IGN);
  });
  std::shared_ptr<SSL_CTX> ctx = tls->Context(server);
  ERR_clear_error();
  ssl_ = SSL_new(ctx.get());  // holds its own reference to the context
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1)
    return absl::InternalError("KV TLS: " + OpenSslErrors());
  while (true) {
    errno = 0;
    const int rc = server ? SSL_accept(ssl_) : SSL_connect(ssl_);
    if (rc == 1) break;
    if (Interrupted(ssl_, rc)) continue;
    const long verify = SSL_get_verify_result(ssl_);
    if (verify != X509_V_OK) {
      ERR_clear_error();
      return absl::UnauthenticatedError(absl::StrCat("KV TLS: the peer's certificate was refused: ",
                                                     X509_verify_cert_error_string(verify)));
    }
    absl::Status s = TlsError("handshake", rc);
    if (absl::IsUnavailable(s) && server) {
      // A peer that does not speak TLS, or shows no certificate, fails here.
      return absl::UnauthenticatedError(absl::StrCat(
          "KV TLS: handshake failed (a plaintext sender, or no certificate from the cluster's "
          "CA?): ",
          s.message()));
    }
    return s;
  }
  if (SSL_get0_peer_certificate(ssl_) == nullptr) {
    failed_ = true;
    return absl::UnauthenticatedError("KV TLS: the peer presented no certificate");
  }
  handshaken_ = true;
  return absl::OkStatus();
}

absl::Status KvStream::SslWrite(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const int chunk = static_cast<int>(std::min<size_t>(n, 1 << 30));
    ERR_clear_error();
    errno = 0;
    const int rc = SSL_write(ssl_, p, chunk);
    if (rc <= 0) {
      if (Interrupted(ssl_, rc)) continue;
      return TlsError("send", rc);
    }
    p += rc;
    n -= static_cast<size_t>(rc);
  }
  return absl::OkStatus();
}

absl::Status KvStream::Write(const void* data, size_t n) {
  if (ssl_ != nullptr) return SslWrite(data, n);
  return SendAll(fd_, data, n) ? absl::OkStatus() : KvSocketError("send");
}

absl::Status KvStream::WriteVector(std::vector<iovec>& iov) {
  if (ssl_ != nullptr) {
    // Small buffers (a frame header, a block of a small model) gathered into records of up to
    // 256 KiB: one TLS record per buffer would cost a record header and a cipher call each.
    constexpr size_t kGather = 256 << 10;
    coalesce_.clear();
    for (iovec& v : iov) {
      if (v.iov_len >= kGather / 4) {
        if (!coalesce_.empty()) {
          absl::Status s = SslWrite(coalesce_.data(), coalesce_.size());
          if (!s.ok()) return s;
          coalesce_.clear();
        }
        absl::Status s = SslWrite(v.iov_base, v.iov_len);
        if (!s.ok()) return s;
      } else {
        const char* b = static_cast<const char*>(v.iov_base);
        coalesce_.insert(coalesce_.end(), b, b + v.iov_len);
        if (coalesce_.size() >= kGather) {
          absl::Status s = SslWrite(coalesce_.data(), coalesce_.size());
          if (!s.ok()) return s;
          coalesce_.clear();
        }
      }
      v.iov_len = 0;
    }
    if (!coalesce_.empty()) return SslWrite(coalesce_.data(), coalesce_.size());
    return absl::OkStatus();
  }
  size_t first = 0;
  while (first < iov.size()) {
    msghdr m{};
    m.msg_iov = iov.data() + first;
    m.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t w = ::sendmsg(fd_, &m, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return KvSocketError("send");
    }
    while (w > 0 && first < iov.size()) {
      const size_t n = std::min<size_t>(static_cast<size_t>(w), iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + n;
      iov[first].iov_len -= n;
      w -= static_cast<ssize_t>(n);
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return absl::OkStatus();
}

absl::Status KvStream::Read(void* data, size_t n) {
  if (ssl_ == nullptr) {
    if (RecvAll(fd_, data, n)) return absl::OkStatus();
    if (errno == 0) return absl::UnavailableError("KV transfer: peer closed the connection");
    return KvSocketError("recv");
  }
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const int chunk = static_cast<int>(std::min<size_t>(n, 1 << 30));
    ERR_clear_error();
    errno = 0;
    const int rc = SSL_read(ssl_, p, chunk);
    if (rc <= 0) {
      if (Interrupted(ssl_, rc)) continue;
      return TlsError("recv", rc);
    }
    p += rc;
    n -= static_cast<size_t>(rc);
  }
  return absl::OkStatus();
}

int KvStream::PollReadable(int timeout_ms) const {
  if (ssl_ != nullptr && SSL_has_pending(ssl_) == 1) return 1;
  pollfd p{fd_, POLLIN, 0};
  const int rc = ::poll(&p, 1, timeout_ms);
  return rc < 0 ? -1 : (rc > 0 ? 1 : 0);
}

}  // namespace tandem
