// The prefill worker's outgoing KV transfers: one lane (a thread, a FIFO of jobs and a cached
// connection) per decode worker, so a slow or hung decode worker delays only its own transfers.
// The engine thread enqueues Begin / layer / End jobs as layers are computed; the lane sends them
// while the engine computes the next layer (layer-wise overlap). A failed job fails the rest of its
// request's jobs; when the connection itself broke, every transfer begun on it fails at once (none
// goes on over a new connection, where the receiver would drain its layers only to refuse it) and
// the lane reconnects on next use. A transfer the receiver refused leaves the others alone. End
// reports the outcome of the whole transfer through its callback, on the lane's thread.
// An idle lane looks at its connection every `idle_check`: one the decode worker closed (it died or
// restarted) is dropped then, with its side link (an NCCL communicator and its staging memory), not
// at the next transfer, which may never come; a lane with no connection left idle for
// `retire_idle_lane` ends its thread and is forgotten (a decode worker that comes back gets a new
// one).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/kv_link.h"
#include "common/transport/kv_stream.h"
#include "common/transport/kv_transport.h"

namespace tandem {

class KvTransferLanes {
 public:
  struct Options {
    KvEndpointInfo info;      // this worker's model and geometry, checked at each handshake
    KvCacheStorage* storage;  // the engine's KV cache (blocks of handed-out requests are stable)
    absl::Duration io_timeout = absl::Seconds(10);
    // Data paths for the layers, tried in this order with each decode worker (KvControlSender::
    // ConnectFirst); nullptr: inline TCP. Each lane's connection joins its own link, kept until the
    // connection fails; a new connection tries them all again.
    std::vector<KvLinkFactory*> data_paths = {nullptr};
    // Fault drill (--fault-stop-after-kv-layer): once this layer of a transfer has been sent, the
    // whole process stops itself (SIGSTOP), once: a peer hung mid-transfer, its sockets open, for
    // the decode side's timeouts to deal with (or a SIGKILL, for a dead one). -1: never.
    int32_t fault_stop_after_layer = -1;
    absl::Duration idle_check = absl::Seconds(1);
    absl::Duration retire_idle_lane = absl::Minutes(5);
    // This worker's KV TLS (null: plaintext); with it, only "tls://" receivers are sent to.
    std::shared_ptr<KvTls> tls = nullptr;
  };
  using Done = std::function<void(const absl::Status& status, double send_seconds)>;

  explicit KvTransferLanes(const Options& options) : options_(options) {}
  ~KvTransferLanes();  // finishes queued jobs' callbacks with UNAVAILABLE and joins the lanes

  // `capability`: the decode worker's for the reservation (PrefillRequest.kv_capability).
  void Begin(const std::string& address, const std::string& id, int64_t num_tokens,
             const std::string& capability);
  // `ready`: the mark taken when the layer's KV writes were enqueued (Backend::Mark); the send
  // waits for that work alone. Null: for all the work enqueued when the lane gets to it.
  void SendLayer(const std::string& address, const std::string& id, int32_t layer,
                 std::vector<int32_t> blocks, std::shared_ptr<WorkMark> ready = nullptr);
  // Ends the transfer; `done` gets OK once the receiver acknowledged every layer.
  void End(const std::string& address, const std::string& id, int32_t first_token, Done done);
  // Skips the request's remaining jobs; its End callback then gets CANCELLED.
  void Cancel(const std::string& id);
  // Lanes with a thread (for tests).
  size_t lanes();

 private:
  struct Job {
    enum Kind { kBegin, kLayer, kEnd } kind = kBegin;
    std::string id;
    int64_t num_tokens = 0;
    std::string capability;
    int32_t layer = 0;
    std::vector<int32_t> blocks;
    std::shared_ptr<WorkMark> ready;
    int32_t first_token = 0;
    Done done;
  };
  struct Lane {
    std::string address;
    std::thread thread;
    std::deque<Job> jobs;
    std::unique_ptr<KvSender> sender;
    absl::flat_hash_map<std::string, absl::Status> failed;  // request → first error
    absl::flat_hash_map<std::string, absl::Time> started;   // request → Begin sent
    absl::flat_hash_set<std::string> begun;  // begun on `sender`'s connection and not ended
  };
  void Enqueue(const std::string& address, Job job);
  void Run(Lane* lane);
  absl::Status Execute(Lane* lane, const Job& job);
  // Drops the lane's connection when it is gone (KvSender::Connected); each transfer begun on it
  // then fails with `cause`.
  static void DropIfDisconnected(Lane* lane, const absl::Status& cause);

  Options options_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Lane>> retired_
      ABSL_GUARDED_BY(mu_);  // threads ended or ending: to join
  absl::flat_hash_set<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> fault_fired_{false};
};

}  // namespace tandem
