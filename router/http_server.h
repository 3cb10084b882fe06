// A small asynchronous HTTP/1.1 server (Boost.Beast over Asio), plaintext or HTTPS (TLS 1.2+ from
// PEM files, reloaded when they change): a fixed number of I/O threads hold every connection, so
// thousands of concurrent server-sent-event streams cost sockets and buffers, not threads.
// Keep-alive, a body limit (413), chunked streaming responses, and a client that goes away
// mid-response reported to the handler (so its request can be cancelled).
//
// The handler runs on an I/O thread and must not block: it answers at once, or keeps the responder
// and answers later from any thread (Responder is thread-safe; its calls are posted to the
// connection's strand, except a plaintext stream's Write(), which the calling thread sends itself
// when nothing of the response is queued before it).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::router {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, as sent
  std::string body;
  std::string content_type;
  std::string authorization;  // the Authorization header ("" when absent)
  std::string peer;           // "ip:port"
};

class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // A whole response. Ignored once the responder has answered.
  virtual void Respond(int status, const std::string& content_type, std::string body) = 0;
  // A streamed response: headers now (chunked transfer), then Write() any number of times, End()
  // once. Writes after the client left are dropped.
  virtual void StartStream(int status, const std::string& content_type) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // `on_disconnect` runs once, on an I/O thread, if the client closes the connection before the
  // response ended (immediately when it already has).
  virtual void OnDisconnect(std::function<void()> on_disconnect) = 0;
};

class HttpServer {
 public:
  struct Options {
    std::string address = "0.0.0.0";
    int port = 0;  // 0: any free port (see port())
    int threads = 2;
    size_t max_body_bytes = 16u << 20;
    // A plaintext stream's Write() sends from the calling thread when nothing of the response is
    // queued before it (false: every write goes by an I/O thread).
    bool write_through = true;
    // HTTPS: a PEM certificate chain and its key (empty: plaintext HTTP). The files are looked at
    // again at most every tls_refresh when connections arrive; a renewed pair serves new ones.
    std::string tls_cert_file, tls_key_file;
    absl::Duration tls_refresh = absl::Seconds(10);
  };
  using Handler =
      std::function<void(const HttpRequest& request, std::shared_ptr<HttpResponder> responder)>;

  // Binds and starts the I/O threads. InvalidArgument/Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const Options& options, Handler handler);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  int threads() const;
  int64_t open_connections() const;
  // Streamed writes sent from the writer's thread (write-through, plaintext only), not an I/O
  // thread.
  int64_t written_through() const;
  // Stops accepting, closes every connection and joins the I/O threads.
  void Stop();

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::router
