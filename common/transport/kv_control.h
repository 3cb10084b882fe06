// The KV transport's two ends, KvControlReceiver (decode workers) and KvControlSender (prefill
// workers), named for the TCP control connection that every transfer has, whatever its data path.
// The KV transport over a TCP control connection. Frames are [u32 length][u8 type][payload];
// control payloads are the protobuf messages of proto/tandem/v1/kv_transfer.proto. Layer bytes (raw
// K then V blocks) follow each layer header on the same connection, or, when the sender asks for a
// side data path the receiver offers (a KvLinkFactory: NCCL or CUDA IPC between GPUs), move over
// that link instead. A receiver may offer several such paths; a sender may try several in turn.
// Sockets carry send and receive timeouts and every link call a timeout, so a silent peer fails the
// transfer instead of hanging a thread.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/kv_link.h"
#include "common/transport/kv_stream.h"
#include "common/transport/kv_transport.h"

namespace tandem {

class KvControlReceiver final : public KvReceiver {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;  // 0: any free port (see port())
    KvCacheStorage* storage = nullptr;
    KvEndpointInfo info;
    absl::Duration io_timeout = absl::Seconds(10);
    // When a sender's connection drops mid-transfer: false fails the transfer at once; true keeps
    // the reservation for another sender (the router retries the prefill elsewhere) until Wait's
    // timeout or Cancel. A new Begin for the request restarts it from layer 0 either way.
    bool keep_reservation_on_sender_loss = false;
    // Side data paths offered to senders that ask for one of them by name (see KvLinkFactory),
    // beside the inline path, which is always offered. Each must serve `storage`; not owned.
    std::vector<KvLinkFactory*> link_factories = {};
    // A connection on which no frame arrives for this long, while none of the transfers begun on it
    // holds a reservation still waiting, is closed, with its side link (an NCCL communicator and
    // its staging memory): what a sender that went silent (stopped, wedged) would otherwise hold
    // for ever. A sender that is only idle reconnects before its next transfer. Infinite: never.
    absl::Duration idle_timeout = absl::InfiniteDuration();
    // Set: every connection is TLS with a certificate from the CA (kv_stream.h); a plaintext or
    // stranger's connection is closed at its handshake, before any frame is read.
    std::shared_ptr<KvTls> tls = nullptr;
  };
  static absl::StatusOr<std::unique_ptr<KvControlReceiver>> Create(const Options& options);
  ~KvControlReceiver() override;

  int port() const { return port_; }
  absl::Status Expect(const std::string& request_id, std::vector<int32_t> dst_blocks,
                      const std::string& capability) override;
  absl::StatusOr<int32_t> Wait(const std::string& request_id, absl::Duration timeout) override;
  // Returns at once; nothing writes into the reservation's blocks afterwards (a layer arriving over
  // a link meanwhile stays in the link's staging memory).
  void Cancel(const std::string& request_id) override;
  void SetCompletionCallback(CompletionCallback callback) override {
    on_complete_ = std::move(callback);
  }

 private:
  struct Transfer {
    std::vector<int32_t> blocks;
    int layers_received = 0;
    bool done = false;
    bool failed = false;
    int64_t connection = -1;  // the connection whose Begin owns it: a retry's, not a dead sender's
    // Still open, and begun on `c`: only then may data from `c` land in its blocks.
    bool OwnedBy(int64_t c) const { return !failed && !done && connection == c; }
    std::string error;
    int32_t first_token = -1;
    std::string capability;  // what a Begin must present ("" = anything)
  };
  explicit KvControlReceiver(const Options& options) : options_(options) {}
  void AcceptLoop();
  void ServeConnection(int fd, int64_t connection);
  // Whether one of `open` (transfers begun on `connection`) still waits for its data from it.
  bool HoldsLiveTransfer(const std::vector<std::string>& open, int64_t connection);
  void Fail(const std::string& request_id, const std::string& error);
  // Receives one layer over `link` for connection `connection`, landing it in the transfer's blocks
  // while the transfer is still wanted and owned by that connection, else dropping it. An error
  // means the link is gone (the connection must close).
  absl::Status ReceiveLayerOverLink(KvLink* link, int64_t connection, const std::string& request_id,
                                    int32_t layer, int32_t num_blocks);

  Options options_;
  CompletionCallback on_complete_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  absl::flat_hash_map<std::string, Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  // By connection; a connection's thread that has ended is joined when the next one is accepted.
  absl::flat_hash_map<int64_t, std::thread> connection_threads_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> ended_connections_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> tls_refusals_{0};
  std::vector<int> connection_fds_ ABSL_GUARDED_BY(mu_);
  int64_t next_connection_ ABSL_GUARDED_BY(mu_) = 0;
};

class KvControlSender final : public KvSender {
 public:
  // Connects to "host:port" and performs the handshake; with `link_factory` (not owned, serving the
  // storage that SendLayer is given) asks for that side data path and joins it. FAILED_PRECONDITION
  // when the receiver refuses the model, geometry or data path; UNAVAILABLE / DEADLINE_EXCEEDED
  // when it cannot be reached. An address "tls://host:port" is a TLS receiver: `tls` (this
  // process's KV TLS) must be given, and is refused for a plaintext address (kv_stream.h). A
  // certificate refused at the handshake fails the connection: UNAUTHENTICATED when this end
  // refuses the receiver's, UNAVAILABLE when the receiver refuses this one's (TLS 1.3 tells the
  // client only once it reads).
  static absl::StatusOr<std::unique_ptr<KvControlSender>> Connect(
      const std::string& address, const KvEndpointInfo& info, absl::Duration io_timeout,
      KvLinkFactory* link_factory = nullptr, KvTls* tls = nullptr);
  // Connect with each of `paths` in turn (nullptr: inline TCP) until the receiver accepts one and
  // its link, if any, is joined: the first that works. A receiver that cannot be reached, or that
  // refuses this sender's model or geometry, is not asked again. The error, when none works, gives
  // every path's reason; `refused`, when set, gets the reasons of the paths tried before the one
  // taken.
  static absl::StatusOr<std::unique_ptr<KvControlSender>> ConnectFirst(
      const std::string& address, const KvEndpointInfo& info, absl::Duration io_timeout,
      const std::vector<KvLinkFactory*>& paths, std::string* refused = nullptr,
      KvTls* tls = nullptr);
  // The side data path in use ("nccl-chunks", "cuda-ipc"), or "inline".
  std::string data_path() const { return data_path_; }
  ~KvControlSender() override;

  absl::Status Begin(const std::string& request_id, int64_t num_tokens,
                     const std::string& capability) override;
  absl::Status SendLayer(const std::string& request_id, int32_t layer,
                         const std::vector<int32_t>& src_blocks, KvCacheStorage* storage,
                         WorkMark* ready = nullptr) override;
  absl::Status End(const std::string& request_id, int32_t first_token) override;
  // False after an I/O error (a frame may be half written) and once the receiver closed the
  // connection: nothing is due from it between transfers, so a readable socket means it closed it.
  // A transfer the receiver refused at End, or a layer refused before it was sent, leaves it true.
  bool Connected() const override;

 private:
  KvControlSender(std::unique_ptr<KvStream> stream, const KvEndpointInfo& info,
                  absl::Duration io_timeout)
      : stream_(std::move(stream)), info_(info), io_timeout_(io_timeout) {}
  // One connection over one path. On failure `path_failed` says whether the data path alone failed
  // (not offered, or its link not joined), where another path may work; not when the receiver was
  // not reached or refused the sender's model or geometry.
  static absl::StatusOr<std::unique_ptr<KvControlSender>> Open(const std::string& address,
                                                               const KvEndpointInfo& info,
                                                               absl::Duration io_timeout,
                                                               KvLinkFactory* link_factory,
                                                               KvTls* tls, bool* path_failed);
  // `s`, noting the connection as broken when it is an error.
  absl::Status Io(absl::Status s);
  std::unique_ptr<KvStream> stream_;
  bool broken_ = false;
  KvEndpointInfo info_;
  absl::Duration io_timeout_;
  std::unique_ptr<KvLink> link_;  // the side data path, when the handshake set one up
  std::string data_path_ = "inline";
  std::vector<iovec> iov_;     // frame header, then K blocks, then V blocks of one layer
  std::vector<char> staging_;  // [2][blocks][block bytes]: a layer copied out of device memory
};

}  // namespace tandem
