#include "router/http_server.h"

#include <sys/socket.h>

#include <cerrno>

#include <array>
#include <atomic>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "boost/asio.hpp"
#include "boost/asio/ssl.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "boost/beast/ssl.hpp"
#include "common/base/logging.h"

namespace tandem::router {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// A connection idle this long between requests is closed; a response write the client does not
// take in this time closes it too (a reader that stopped reading).
constexpr std::chrono::seconds kIdleTimeout{120};
constexpr std::chrono::seconds kWriteTimeout{60};
// A TLS handshake not done in this time closes the connection.
constexpr std::chrono::seconds kHandshakeTimeout{30};

// Posting to the I/O threads after the server stopped would touch a destroyed io_context, and so
// would a session outliving it (its socket deregisters from the io_context's reactor): responders
// check `open` and hold a session only under a reader lock, which Stop() waits out as the writer.
struct Lifeline {
  absl::Mutex mu;
  bool open ABSL_GUARDED_BY(mu) = true;
};

// What a Responder calls, on the connection's strand: a plaintext or a TLS session.
class SessionBase : public std::enable_shared_from_this<SessionBase> {
 public:
  virtual ~SessionBase() = default;
  virtual net::any_io_executor executor() = 0;
  virtual void DoRespond(int status, const std::string& content_type, std::string body) = 0;
  virtual void DoStartStream(int status, const std::string& content_type) = 0;
  virtual void DoWrite(std::string data) = 0;
  virtual void DoEnd() = 0;
  virtual void DoOnDisconnect(std::function<void()> f) = 0;

  // Write-through (plaintext streams): a Write() from the thread that produced the event goes
  // straight to the socket when nothing else of the response is queued or posted, instead of
  // hopping to an I/O thread (on a busy machine, the wait for that thread to be scheduled is most
  // of what an event's trip costs). A post counts itself here, so that no later write passes it.
  void Posting() {
    absl::MutexLock lock(&direct_mu_);
    ++posted_;
  }
  void Arrived() {
    absl::MutexLock lock(&direct_mu_);
    --posted_;
  }
  // Sends `chunk` (already framed) now if the socket's write side is idle. kSent: all of it;
  // kRest: `chunk` is now its unsent rest, which the caller posts (DoWriteRaw) before anything else
  // (write-through stays closed until the I/O thread has written it); kPost: nothing sent.
  enum class Through { kPost, kSent, kRest };
  Through TryWriteThrough(std::string& chunk) {
    absl::MutexLock lock(&direct_mu_);
    if (!direct_open_ || posted_ != 0) return Through::kPost;
    size_t sent = 0;
    while (sent < chunk.size()) {
      const ssize_t n =
          ::send(direct_fd_, chunk.data() + sent, chunk.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        break;  // a full socket buffer (or an error, which the queued write then meets)
      }
    }
    direct_writes_->fetch_add(1, std::memory_order_relaxed);
    if (sent == chunk.size()) return Through::kSent;
    direct_open_ = false;  // the rest goes by the I/O thread, and everything after it too
    chunk.erase(0, sent);
    return Through::kRest;
  }
  virtual void DoWriteRaw(std::string bytes) = 0;

 protected:
  explicit SessionBase(std::atomic<int64_t>* direct_writes) : direct_writes_(direct_writes) {}
  // On the strand: the socket's write side is idle (or no longer) as far as the session knows.
  void SetWriteThrough(bool open, int fd = -1) {
    absl::MutexLock lock(&direct_mu_);
    direct_open_ = open;
    if (open) direct_fd_ = fd;
  }

 private:
  absl::Mutex direct_mu_;
  int posted_ ABSL_GUARDED_BY(direct_mu_) = 0;  // Responder calls posted, not yet run
  bool direct_open_ ABSL_GUARDED_BY(direct_mu_) = false;
  int direct_fd_ ABSL_GUARDED_BY(direct_mu_) = -1;
  std::atomic<int64_t>* direct_writes_;
};

class Responder final : public HttpResponder {
 public:
  Responder(std::weak_ptr<SessionBase> session, std::shared_ptr<Lifeline> lifeline)
      : session_(std::move(session)), lifeline_(std::move(lifeline)) {}
  void Respond(int status, const std::string& content_type, std::string body) override;
  void StartStream(int status, const std::string& content_type) override;
  void Write(std::string data) override;
  void End() override;
  void OnDisconnect(std::function<void()> on_disconnect) override;

 private:
  template <typename F>
  void Post(F f);
  // Held across each call, so that a write-through's unsent rest is posted before any later call.
  absl::Mutex mu_;
  std::weak_ptr<SessionBase> session_;
  std::shared_ptr<Lifeline> lifeline_;
};

using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// One connection: requests read one after another (keep-alive), each answered whole or streamed.
// Stream is PlainStream or TlsStream (HTTPS: the handshake first; see WatchForDisconnect).
template <typename Stream>
class Session final : public SessionBase {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

  // `context`: the TLS session's (null for PlainStream), kept while the connection lives.
  Session(tcp::socket socket, std::shared_ptr<net::ssl::context> context,
          const HttpServer::Handler* handler, size_t max_body, std::shared_ptr<Lifeline> lifeline,
          std::atomic<int64_t>* connections, std::atomic<int64_t>* direct_writes,
          bool write_through)
      : SessionBase(direct_writes),
        write_through_(write_through),
        context_(std::move(context)),
        stream_(MakeStream(std::move(socket), context_.get())),
        handler_(handler),
        max_body_(max_body),
        lifeline_(std::move(lifeline)),
        connections_(connections) {
    connections_->fetch_add(1);
    beast::error_code ec;
    // Events are small writes: Nagle's algorithm would hold each back until the last one's ACK.
    Lowest().socket().set_option(tcp::no_delay(true), ec);
    const auto endpoint = Lowest().socket().remote_endpoint(ec);
    if (!ec) peer_ = absl::StrCat(endpoint.address().to_string(), ":", endpoint.port());
  }
  ~Session() override { connections_->fetch_sub(1); }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = Self()] {
      if constexpr (kTls) {
        self->Lowest().expires_after(kHandshakeTimeout);
        self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) {
            self->Close();
            return;
          }
          self->Read();
        });
      } else {
        self->Read();
      }
    });
  }

  net::any_io_executor executor() override { return stream_.get_executor(); }

  // On the strand, from Responder.
  void DoRespond(int status, const std::string& content_type, std::string body) override {
    if (answered_ || closed_) return;
    answered_ = true;
    auto response = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(status), version_);
    response->set(http::field::server, "tandem");
    response->set(http::field::content_type, content_type);
    response->keep_alive(keep_alive_);
    response->body() = std::move(body);
    response->prepare_payload();
    Enqueue([self = Self(), response](auto done) {
      http::async_write(self->stream_, *response,
                        [response, done](beast::error_code ec, size_t) { done(ec); });
    });
    finished_ = true;
    Enqueue(nullptr);  // marks the end of the response
  }

  void DoStartStream(int status, const std::string& content_type) override {
    if (answered_ || closed_) return;
    answered_ = true;
    streaming_ = true;
    auto response = std::make_shared<http::response<http::empty_body>>(
        static_cast<http::status>(status), version_);
    response->set(http::field::server, "tandem");
    response->set(http::field::content_type, content_type);
    response->set(http::field::cache_control, "no-cache");
    response->keep_alive(keep_alive_);
    response->chunked(true);
    auto serializer = std::make_shared<http::response_serializer<http::empty_body>>(*response);
    Enqueue([self = Self(), response, serializer](auto done) {
      http::async_write_header(
          self->stream_, *serializer,
          [response, serializer, done](beast::error_code ec, size_t) { done(ec); });
    });
  }

  void DoWrite(std::string data) override {
    if (!streaming_ || finished_ || closed_ || data.empty()) return;
    auto chunk = std::make_shared<std::string>(std::move(data));
    Enqueue([self = Self(), chunk](auto done) {
      net::async_write(self->stream_, http::make_chunk(net::buffer(*chunk)),
                       [chunk, done](beast::error_code ec, size_t) { done(ec); });
    });
  }

  // The unsent rest of a chunk that TryWriteThrough began (its framing included).
  void DoWriteRaw(std::string bytes) override {
    if (closed_) return;
    auto rest = std::make_shared<std::string>(std::move(bytes));
    Enqueue([self = Self(), rest](auto done) {
      net::async_write(self->stream_, net::buffer(*rest),
                       [rest, done](beast::error_code ec, size_t) { done(ec); });
    });
  }

  void DoEnd() override {
    if (!streaming_ || finished_ || closed_) return;
    finished_ = true;
    Enqueue([self = Self()](auto done) {
      net::async_write(self->stream_, http::make_chunk_last(),
                       [done](beast::error_code ec, size_t) { done(ec); });
    });
    Enqueue(nullptr);
  }

  void DoOnDisconnect(std::function<void()> f) override {
    if (closed_ && !finished_) {
      f();
      return;
    }
    on_disconnect_ = std::move(f);
  }

 private:
  using Done = std::function<void(beast::error_code)>;
  using Op = std::function<void(Done)>;  // null: the response is complete

  std::shared_ptr<Session> Self() { return std::static_pointer_cast<Session>(shared_from_this()); }
  static Stream MakeStream(tcp::socket socket, net::ssl::context* context) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *context);
    } else {
      return Stream(std::move(socket));
    }
  }
  auto& Lowest() { return beast::get_lowest_layer(stream_); }

  void Read() {
    parser_.emplace();
    parser_->body_limit(max_body_);
    parser_->header_limit(64 * 1024);
    Lowest().expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = Self()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      version_ = 11;
      keep_alive_ = false;
      drain_ = true;  // the client is still sending: read it off before closing, or it sees a reset
      answered_ = false;
      finished_ = false;
      DoRespond(413, "application/json",
                absl::StrCat(
                    R"({"error": {"message": "the request body is larger than )", max_body_,
                    R"( bytes", "type": "invalid_request_error", "param": null, "code": null}})"));
      return;
    }
    if (ec) {
      Close();
      return;
    }
    Lowest().expires_never();
    const auto& message = parser_->get();
    HttpRequest request;
    request.method = std::string(message.method_string());
    request.target = std::string(message.target());
    request.body = message.body();
    request.content_type = std::string(message[http::field::content_type]);
    request.authorization = std::string(message[http::field::authorization]);
    request.peer = peer_;
    version_ = message.version();
    keep_alive_ = message.keep_alive();
    answered_ = streaming_ = finished_ = false;
    on_disconnect_ = nullptr;
    WatchForDisconnect();
    auto responder = std::make_shared<Responder>(weak_from_this(), lifeline_);
    (*handler_)(request, std::move(responder));
  }

  // While a response is pending the client has nothing to send: the socket becoming readable with
  // nothing to read means it closed. Readiness alone is not proof: epoll may report the socket
  // readable after the request's bytes were read (a readiness seen before the read and handled
  // after it, likelier with more I/O threads), so a peek decides: 0 bytes is the client's close,
  // data is a pipelined request, EAGAIN was spurious and the watch is armed again.
  //
  // Over TLS a peek sees records, not what they hold (a closing client's close_notify is data): the
  // watch is a real read through the TLS stream instead. An error or end of stream is the client's
  // close; bytes are a pipelined request, kept in the buffer the next request is parsed from. While
  // that read is pending the next request's read waits for it (two reads may not overlap): the
  // response's end then only marks the session as waiting for it (OnWatched).
  void WatchForDisconnect() {
    if constexpr (kTls) {
      watching_ = true;
      stream_.async_read_some(
          buffer_.prepare(4096),
          [self = Self()](beast::error_code ec, size_t n) { self->OnWatched(ec, n); });
    } else {
      WatchForDisconnect(++request_seq_);
    }
  }
  void OnWatched(beast::error_code ec, size_t n) {
    watching_ = false;
    if (ec) {
      Close();  // the client left (or went idle past the timeout while awaited)
      return;
    }
    buffer_.commit(n);
    if (awaiting_request_) {
      awaiting_request_ = false;
      Lowest().expires_never();
      Read();
    }
  }
  void WatchForDisconnect(uint64_t request) {
    Lowest().socket().async_wait(
        tcp::socket::wait_read, [self = Self(), request](beast::error_code ec) {
          if (ec || request != self->request_seq_ || self->finished_ || self->closed_) return;
          char byte;
          const ssize_t n =
              ::recv(self->Lowest().socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
          if (n > 0) return;  // pipelined data
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            self->WatchForDisconnect(request);
            return;
          }
          self->Close();  // end of stream, or the connection reset
        });
  }

  void Enqueue(Op op) {
    queue_.push_back(std::move(op));
    if (!writing_) WriteNext();
  }

  // Write-through opens when a plaintext stream's queue runs dry mid-response, and closes when
  // anything is queued, the response ends, or the connection closes.
  void UpdateWriteThrough() {
    if constexpr (!kTls) {
      const bool open =
          write_through_ && streaming_ && !finished_ && !closed_ && !writing_ && queue_.empty();
      SetWriteThrough(open, open ? Lowest().socket().native_handle() : -1);
    }
  }

  void WriteNext() {
    if (queue_.empty() || closed_) {
      writing_ = false;
      UpdateWriteThrough();
      return;
    }
    writing_ = true;
    UpdateWriteThrough();
    Op op = std::move(queue_.front());
    queue_.pop_front();
    if (!op) {  // response complete: next request, or close
      writing_ = false;
      if (keep_alive_ && watching_) {  // TLS: the pending watch read takes the next request's bytes
        awaiting_request_ = true;
        Lowest().expires_after(kIdleTimeout);
      } else if (keep_alive_) {
        Read();
      } else {
        beast::error_code ignored;
        Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
        if (drain_) {
          Drain();
        } else {
          Close();
        }
      }
      return;
    }
    Lowest().expires_after(kWriteTimeout);
    op([self = Self()](beast::error_code ec) {
      self->Lowest().expires_never();
      if (ec) {
        self->Close();
        return;
      }
      self->WriteNext();
    });
  }

  // Discards what the client still sends (up to the idle timeout), then closes.
  void Drain() {
    Lowest().expires_after(std::chrono::seconds(10));
    stream_.async_read_some(net::buffer(scratch_), [self = Self()](beast::error_code ec, size_t) {
      if (ec) {
        self->Close();
        return;
      }
      self->Drain();
    });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    UpdateWriteThrough();  // before the descriptor can be reused
    queue_.clear();
    beast::error_code ignored;
    Lowest().socket().close(ignored);
    if (answered_ ? !finished_ : true) {
      if (on_disconnect_) {
        auto f = std::move(on_disconnect_);
        on_disconnect_ = nullptr;
        f();
      }
    }
  }

  const bool write_through_;
  std::shared_ptr<net::ssl::context> context_;
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  const HttpServer::Handler* handler_;
  size_t max_body_;
  std::shared_ptr<Lifeline> lifeline_;
  std::atomic<int64_t>* connections_;
  std::string peer_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool answered_ = false;  // a response (whole or streamed) has begun
  bool streaming_ = false;
  bool finished_ = false;  // the response's last part is queued
  bool closed_ = false;
  bool writing_ = false;
  uint64_t request_seq_ = 0;       // which request a disconnect watch belongs to
  bool watching_ = false;          // TLS: the disconnect watch's read is pending
  bool awaiting_request_ = false;  // TLS: the response ended while it was: it reads on
  bool drain_ = false;
  std::array<char, 65536> scratch_;
  std::deque<Op> queue_;
  std::function<void()> on_disconnect_;
};

// Runs f(session) on the session's strand. Under a reader lock of the lifeline, server open.
template <typename F>
void PostTo(const std::shared_ptr<SessionBase>& session, F f) {
  session->Posting();
  net::post(session->executor(), [session, f = std::move(f)]() mutable {
    session->Arrived();
    f(*session);
  });
}

template <typename F>
void Responder::Post(F f) {
  absl::ReaderMutexLock lock(&lifeline_->mu);
  if (!lifeline_->open) return;
  std::shared_ptr<SessionBase> session = session_.lock();
  if (session) PostTo(session, std::move(f));
}

void Responder::Respond(int status, const std::string& content_type, std::string body) {
  absl::MutexLock lock(&mu_);
  Post([status, content_type, body = std::move(body)](SessionBase& s) mutable {
    s.DoRespond(status, content_type, std::move(body));
  });
}

void Responder::StartStream(int status, const std::string& content_type) {
  absl::MutexLock lock(&mu_);
  Post([status, content_type](SessionBase& s) { s.DoStartStream(status, content_type); });
}

void Responder::Write(std::string data) {
  if (data.empty()) return;
  absl::MutexLock lock(&mu_);
  absl::ReaderMutexLock alive(&lifeline_->mu);
  if (!lifeline_->open) return;
  const std::shared_ptr<SessionBase> session = session_.lock();  // released before `alive`
  if (!session) return;
  // The chunk as Beast frames one: its size in hex, CRLF, the bytes, CRLF.
  std::string chunk = absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
  switch (session->TryWriteThrough(chunk)) {
    case SessionBase::Through::kSent: return;
    case SessionBase::Through::kRest:
      PostTo(session,
             [rest = std::move(chunk)](SessionBase& s) mutable { s.DoWriteRaw(std::move(rest)); });
      return;
    case SessionBase::Through::kPost:
      PostTo(session,
             [data = std::move(data)](SessionBase& s) mutable { s.DoWrite(std::move(data)); });
      return;
  }
}

void Responder::End() {
  absl::MutexLock lock(&mu_);
  Post([](SessionBase& s) { s.DoEnd(); });
}

void Responder::OnDisconnect(std::function<void()> on_disconnect) {
  absl::MutexLock lock(&mu_);
  Post([f = std::move(on_disconnect)](SessionBase& s) mutable { s.DoOnDisconnect(std::move(f)); });
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(const Options& options, Handler handler)
      : options_(options),
        handler_(std::move(handler)),
        acceptor_(ioc_),
        lifeline_(std::make_shared<Lifeline>()) {}

  absl::Status Bind() {
    if (!options_.tls_cert_file.empty()) {
      absl::StatusOr<std::shared_ptr<net::ssl::context>> context = LoadTls();
      if (!context.ok()) return context.status();
      tls_ = *std::move(context);
      tls_checked_ = absl::Now();
    }
    beast::error_code ec;
    const auto address = net::ip::make_address(options_.address, ec);
    if (ec)
      return absl::InvalidArgumentError(
          absl::StrCat("bad HTTP address ", options_.address, ": ", ec.message()));
    const tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", options_.address,
                                                 ":", options_.port, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (int i = 0; i < std::max(1, options_.threads); ++i)
      threads_.emplace_back([this] { ioc_.run(); });
    return absl::OkStatus();
  }

  void Stop() {
    {
      absl::MutexLock lock(&lifeline_->mu);
      if (!lifeline_->open) return;
      lifeline_->open = false;
    }
    net::post(ioc_, [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
    });
    ioc_.stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  ~Impl() { Stop(); }

  int port_ = 0;
  Options options_;
  Handler handler_;
  std::atomic<int64_t> connections_{0};
  std::atomic<int64_t> direct_writes_{0};

 private:
  // A TLS context from the certificate and key files (HTTPS), with their modification times.
  absl::StatusOr<std::shared_ptr<net::ssl::context>> LoadTls() {
    auto context = std::make_shared<net::ssl::context>(net::ssl::context::tls_server);
    context->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                         net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                         net::ssl::context::no_tlsv1_1);
    beast::error_code ec;
    context->use_certificate_chain_file(options_.tls_cert_file, ec);
    if (!ec) context->use_private_key_file(options_.tls_key_file, net::ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("HTTPS: cannot use ", options_.tls_cert_file,
                                                     " and ", options_.tls_key_file, ": ",
                                                     ec.message()));
    }
    tls_stamp_ = TlsStamp();
    return context;
  }
  // The certificate and key files' modification times, to tell a renewed pair.
  std::string TlsStamp() const {
    return FileStamp(options_.tls_cert_file) + "|" + FileStamp(options_.tls_key_file);
  }
  static std::string FileStamp(const std::string& path) {
    std::error_code ec;
    const auto t = std::filesystem::last_write_time(path, ec);
    return ec ? "" : std::to_string(t.time_since_epoch().count());
  }
  // The context for a new connection (null: plaintext). At most every tls_refresh, the files are
  // looked at again, and a changed pair loaded (a pair that does not load keeps the one in use).
  std::shared_ptr<net::ssl::context> TlsContext() {
    if (tls_ == nullptr) return nullptr;
    if (absl::Now() - tls_checked_ >= options_.tls_refresh) {
      tls_checked_ = absl::Now();
      if (TlsStamp() != tls_stamp_) {
        absl::StatusOr<std::shared_ptr<net::ssl::context>> context = LoadTls();
        if (context.ok()) {
          tls_ = *std::move(context);
          TANDEM_LOG(INFO) << "HTTPS: certificate " << options_.tls_cert_file << " reloaded";
        } else {
          TANDEM_LOG(WARNING) << context.status().message() << "; keeping the one in use";
        }
      }
    }
    return tls_;
  }

  void Accept() {
    acceptor_.async_accept(
        net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
          if (ec) {
            if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
          } else if (std::shared_ptr<net::ssl::context> context = TlsContext()) {
            std::make_shared<Session<TlsStream>>(std::move(socket), std::move(context), &handler_,
                                                 options_.max_body_bytes, lifeline_, &connections_,
                                                 &direct_writes_, options_.write_through)
                ->Start();
          } else {
            std::make_shared<Session<PlainStream>>(
                std::move(socket), nullptr, &handler_, options_.max_body_bytes, lifeline_,
                &connections_, &direct_writes_, options_.write_through)
                ->Start();
          }
          Accept();
        });
  }

  net::io_context ioc_;
  tcp::acceptor acceptor_;
  // HTTPS (null: plaintext); touched by the accept handler only (one at a time).
  std::shared_ptr<net::ssl::context> tls_;
  std::string tls_stamp_;
  absl::Time tls_checked_;
  std::shared_ptr<Lifeline> lifeline_;
  std::vector<std::thread> threads_;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const Options& options,
                                                              Handler handler) {
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (absl::Status s = impl->Bind(); !s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }
int HttpServer::port() const { return impl_->port_; }
int HttpServer::threads() const { return std::max(1, impl_->options_.threads); }
int64_t HttpServer::open_connections() const { return impl_->connections_.load(); }
int64_t HttpServer::written_through() const { return impl_->direct_writes_.load(); }
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace tandem::router
