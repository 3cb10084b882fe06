// HttpServer's streamed responses: events written from a thread of the caller's reach the client
// whole and in order, whether they go straight to the socket (write-through) or by the I/O thread
// (a full socket buffer, a client that reads slowly), and a client that leaves mid-stream is
// reported and costs nothing after.
#include "router/http_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/support/loopback.h"

namespace tandem::router {
namespace {

using ::tandem::test_support::ConnectLoopback;

bool SendAll(int fd, const std::string& s) {
  size_t sent = 0;
  while (sent < s.size()) {
    const ssize_t n = ::send(fd, s.data() + sent, s.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads one chunked response: its head, and its body decoded. False when the bytes are not a
// well-formed chunked response (a chunk's framing broken by an interleaved write, say).
bool ReadChunkedResponse(int fd, std::string* head, std::string* body) {
  std::string in;
  char buf[65536];
  size_t pos = 0;
  // Makes at least `n` bytes from `pos` available.
  auto need = [&](size_t n) {
    while (in.size() < pos + n) {
      const ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
      if (got <= 0) return false;
      in.append(buf, static_cast<size_t>(got));
    }
    return true;
  };
  auto line = [&](std::string* out) {
    for (;;) {
      const size_t eol = in.find("\r\n", pos);
      if (eol != std::string::npos) {
        *out = in.substr(pos, eol - pos);
        pos = eol + 2;
        return true;
      }
      if (!need(in.size() - pos + 1)) return false;
    }
  };
  for (;;) {
    const size_t end = in.find("\r\n\r\n");
    if (end != std::string::npos) {
      *head = in.substr(0, end);
      pos = end + 4;
      break;
    }
    if (!need(in.size() + 1)) return false;
  }
  body->clear();
  for (;;) {
    std::string size_line;
    if (!line(&size_line)) return false;
    uint64_t size = 0;
    if (!absl::SimpleHexAtoi(size_line, &size)) return false;
    if (size == 0) {
      std::string trailer;
      return line(&trailer) && trailer.empty();
    }
    if (!need(size + 2)) return false;
    body->append(in, pos, size);
    if (in.compare(pos + size, 2, "\r\n") != 0) return false;
    pos += size + 2;
  }
}

std::string Request(const std::string& path) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n");
}

// A server whose handler streams `events` from a thread of its own, as the router's flows do: each
// event `size` bytes of a pattern that names its index, so that a lost, repeated or reordered byte
// shows.
struct StreamingServer {
  struct Plan {
    int events = 0;
    size_t size = 0;
    std::chrono::microseconds gap{0};
  };
  explicit StreamingServer(Plan p) : plan(p) {
    HttpServer::Options options;
    options.address = "127.0.0.1";
    options.threads = 2;
    auto started =
        HttpServer::Start(options, [this](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
          r->OnDisconnect([this] { disconnected.Notify(); });
          r->StartStream(200, "text/event-stream");
          writers.emplace_back([this, r] { Stream(r); });
        });
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) server = *std::move(started);
  }
  ~StreamingServer() {
    for (std::thread& t : writers) t.join();
    server.reset();
  }
  static std::string Event(int i, size_t size) {
    std::string e = absl::StrCat("data: ", i, " ");
    while (e.size() + 1 < size) e.push_back(static_cast<char>('a' + (i + e.size()) % 26));
    e.push_back('\n');
    return e;
  }
  std::string Expected() const {
    std::string all;
    for (int i = 0; i < plan.events; ++i) all += Event(i, plan.size);
    return all;
  }
  void Stream(std::shared_ptr<HttpResponder> r) {
    for (int i = 0; i < plan.events; ++i) {
      r->Write(Event(i, plan.size));
      if (plan.gap.count() > 0) std::this_thread::sleep_for(plan.gap);
    }
    r->End();
    ended.fetch_add(1);
  }

  // A client connection that has sent the one request: the stream begins (-1: no connection).
  int Open() const {
    const int fd = ConnectLoopback(server->port());
    if (fd >= 0 && !SendAll(fd, Request("/stream"))) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  // Waits up to 10 s for the writers to have written `n` Ends; whether they did.
  bool WaitEnded(int n) const {
    for (int i = 0; i < 500 && ended.load() < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return ended.load() == n;
  }

  Plan plan;
  std::unique_ptr<HttpServer> server;
  std::vector<std::thread> writers;
  absl::Notification disconnected;  // (the one stream's client left)
  std::atomic<int> ended{0};        // streams whose writer wrote its End()
};

TEST(HttpServerTest, StreamedEventsArriveWholeAndInOrderMostlyWrittenThrough) {
  // Small events with gaps, as tokens come: once the head is out the writer's own thread sends
  // them.
  StreamingServer s({.events = 200, .size = 90, .gap = std::chrono::microseconds(200)});
  ASSERT_NE(s.server, nullptr);
  const int fd = s.Open();
  ASSERT_GE(fd, 0);
  std::string head, body;
  ASSERT_TRUE(ReadChunkedResponse(fd, &head, &body)) << head;
  EXPECT_NE(head.find("200"), std::string::npos) << head;
  EXPECT_NE(head.find("chunked"), std::string::npos) << head;
  EXPECT_EQ(body, s.Expected());
  // Most events went straight from the writer: only those written before the head was out (and any
  // that found the socket's write side busy) took the I/O thread.
  EXPECT_GE(s.server->written_through(), 150) << "of 200 events";
  ::close(fd);
}

TEST(HttpServerTest, AClientThatReadsLateGetsEveryByteInOrder) {
  // 24 MiB of events, none read for half a second: the socket's buffers fill, a write-through sends
  // part of an event and leaves the rest to the I/O thread, and every later event queues behind it.
  StreamingServer s({.events = 384, .size = 64 << 10});
  ASSERT_NE(s.server, nullptr);
  const int fd = s.Open();
  ASSERT_GE(fd, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::string head, body;
  ASSERT_TRUE(ReadChunkedResponse(fd, &head, &body)) << head;
  ASSERT_EQ(body.size(), s.Expected().size());
  EXPECT_TRUE(body == s.Expected()) << "the body differs from what was written";
  // Both ways were taken: straight from the writer until the buffers filled, then by the I/O
  // thread.
  EXPECT_GT(s.server->written_through(), 0);
  EXPECT_LT(s.server->written_through(), 384);
  ::close(fd);
}

TEST(HttpServerTest, KeepAliveStreamsOneAfterAnotherOnOneConnection) {
  StreamingServer s({.events = 50, .size = 100, .gap = std::chrono::microseconds(100)});
  ASSERT_NE(s.server, nullptr);
  const int fd = s.Open();
  ASSERT_GE(fd, 0);
  for (int round = 0; round < 3; ++round) {
    if (round > 0) {
      ASSERT_TRUE(SendAll(fd, Request("/stream")));
    }
    std::string head, body;
    ASSERT_TRUE(ReadChunkedResponse(fd, &head, &body)) << "round " << round;
    EXPECT_EQ(body, s.Expected()) << "round " << round;
  }
  ::close(fd);
}

TEST(HttpServerTest, AClientLeavingMidStreamIsReportedAndLaterWritesAreDropped) {
  // Long enough that the client leaves while the writer still writes.
  StreamingServer s({.events = 1000, .size = 200, .gap = std::chrono::microseconds(500)});
  ASSERT_NE(s.server, nullptr);
  const int fd = s.Open();
  ASSERT_GE(fd, 0);
  char buf[4096];
  ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);  // the stream began
  ::close(fd);
  EXPECT_TRUE(s.disconnected.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(s.WaitEnded(1)) << "the writer did not finish";
  for (int i = 0; i < 100 && s.server->open_connections() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(s.server->open_connections(), 0);
}

TEST(HttpServerTest, StoppingTheServerMidStreamLeavesItsWritersSafe) {
  // The writer goes on writing after the server (and its I/O threads and io_context) is gone: its
  // writes, written through or posted, must be dropped without touching what was destroyed.
  StreamingServer s({.events = 1000, .size = 200, .gap = std::chrono::microseconds(500)});
  ASSERT_NE(s.server, nullptr);
  const int fd = s.Open();
  ASSERT_GE(fd, 0);
  char buf[4096];
  ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);  // the stream began
  s.server.reset();
  EXPECT_TRUE(s.WaitEnded(1)) << "the writer did not finish";
  ::close(fd);
}

}  // namespace
}  // namespace tandem::router
