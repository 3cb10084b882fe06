// The router's view of the cluster: the worker registry (registrations, heartbeats, liveness),
// each worker's description, the routing policies, and one gRPC channel per worker. Workers either
// register themselves (Registration service) or are listed statically by flag or found by DNS, in
// which case the cluster polls their WorkerStatus service as their heartbeat. A worker that misses
// heartbeats for `heartbeat_timeout`, fails a call with UNAVAILABLE, or drains receives no new
// work. Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/tls.h"
#include "router/decode_policy.h"
#include "router/prefill_policy.h"
#include "router/worker_registry.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

class Cluster {
 public:
  struct Options {
    std::string model_fingerprint;  // workers serving another model are refused
    absl::Duration heartbeat_timeout = absl::Seconds(3);
    std::vector<std::string> static_workers = {};  // host:port, polled through WorkerStatus
    // NAME:PORT names resolved every dns_refresh to all their addresses (a Kubernetes headless
    // Service: one per ready pod), each polled like a static worker. An address that disappears
    // (its pod terminating) gets no new work but is polled, as draining, until it stops answering,
    // so its streams finish. Several routers discover the same workers.
    std::vector<std::string> dns_workers = {};
    std::string dns_server = "";  // IP:PORT; empty: the system resolver
    absl::Duration dns_refresh = absl::Seconds(5);
    absl::Duration poll_interval = absl::Milliseconds(500);
    // HTTP/2 keepalive pings on the router's connections to workers (a peer that does not answer
    // within the same time again is dropped, failing its calls with UNAVAILABLE).
    absl::Duration keepalive = absl::Seconds(2);
    absl::Duration keepalive_timeout = absl::Seconds(2);
    PrefillPolicy::Options prefill_policy = {};
    rpc::TlsOptions tls = {};  // how the router dials workers (mutual TLS with a certificate)
  };
  explicit Cluster(const Options& options);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  absl::Status Register(const v1::WorkerDescription& worker);
  absl::Status Heartbeat(const std::string& address, const v1::WorkerLoad& load);
  void MarkUnhealthy(const std::string& address);
  // The worker answered a call: liveness as a heartbeat gives it (WorkerRegistry::Heard).
  void Heard(const std::string& address);
  // Alive (heard from in time, no failed call since). A draining worker is healthy: its calls in
  // flight continue, it just gets no new ones.
  bool IsHealthy(const std::string& address) const;

  struct Worker {
    std::string address;
    v1::WorkerDescription description;
  };
  // A prefill worker for the prompt (prefix affinity, bounded load), skipping `exclude`.
  absl::StatusOr<Worker> ChoosePrefill(const std::vector<int32_t>& prompt,
                                       const absl::flat_hash_set<std::string>& exclude) const;
  // A decode (or, with `combined`, combined) worker with room for the demand. UNAVAILABLE when
  // none is live; RESOURCE_EXHAUSTED when none has room.
  absl::StatusOr<Worker> ChooseDecode(const DecodeDemand& demand, bool combined,
                                      const absl::flat_hash_set<std::string>& exclude) const;
  // Disaggregated when live prefill and decode workers exist; else combined when live combined
  // workers exist; UNAVAILABLE otherwise.
  absl::StatusOr<bool> UseDisaggregated() const;
  int64_t num_live(v1::WorkerRole role) const;
  // The smallest max_model_len over registered workers (0 when none).
  int64_t max_model_len() const;

  // The router's own count of work it sent a worker, so that choices made between two heartbeats
  // see each other: while held, the worker counts one more sequence and `blocks` fewer free blocks
  // (until its next heartbeat reports them itself).
  class Assignment {
   public:
    Assignment(Cluster* cluster, std::string address, int64_t blocks);
    ~Assignment();
    Assignment(const Assignment&) = delete;
    Assignment& operator=(const Assignment&) = delete;

   private:
    Cluster* cluster_;
    std::string address_;
  };

  v1::Prefill::Stub* prefill_stub(const std::string& address);
  v1::Decode::Stub* decode_stub(const std::string& address);
  v1::ListWorkersResponse List() const;

 private:
  std::vector<WorkerLoad> Live(v1::WorkerRole role,
                               const absl::flat_hash_set<std::string>& exclude) const;
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  // Polls static and DNS-discovered workers' WorkerStatus as their heartbeat (one thread).
  void PollWorkers();

  Options options_;
  WorkerRegistry registry_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, v1::WorkerDescription> descriptions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, v1::WorkerLoad> loads_ ABSL_GUARDED_BY(mu_);
  struct Accounting {
    int64_t active = 0;                  // router flows holding an Assignment
    int64_t blocks_since_heartbeat = 0;  // blocks assigned after the last heartbeat
  };
  absl::flat_hash_map<std::string, Accounting> accounting_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<v1::Prefill::Stub>> prefill_stubs_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<v1::Decode::Stub>> decode_stubs_
      ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex policy_mu_;
  mutable PrefillPolicy prefill_policy_ ABSL_GUARDED_BY(policy_mu_);
  absl::Notification stop_;
  std::thread poller_;
};

}  // namespace tandem::router
