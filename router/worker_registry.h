// The router's view of its workers: registration (address, role, model fingerprint, KV geometry),
// heartbeats with load, health-check verdicts, and liveness. A worker whose last heartbeat is older
// than `heartbeat_timeout` (default 3 s), or whose health check failed, is reported unhealthy and
// receives no new work until it is heard from again. Workers listed statically by flag register the
// same way. Thread-safe; time comes from an injectable clock so tests need not sleep.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "router/worker_load.h"

namespace tandem::router {

enum class WorkerRole { kPrefill, kDecode, kCombined };

struct WorkerRegistration {
  std::string address;  // host:port, the worker's identity
  WorkerRole role = WorkerRole::kCombined;
  std::string model_fingerprint;
  int64_t num_layers = 0, num_kv_heads = 0, head_dim = 0, block_size = 16;
  std::string kv_dtype = "F32";  // what its KV cache stores ("F32", "BF16", "F16")
  int64_t total_blocks = 0;
};

struct Heartbeat {
  int64_t waiting = 0, running = 0, free_blocks = 0;
  bool draining = false;  // finishing in-flight work: no new work, yet not dead
  bool kv_full = false;   // KV usage above the worker's high-water mark: no new work
};

class WorkerRegistry {
 public:
  struct Options {
    std::string model_fingerprint;  // workers serving another model are refused
    absl::Duration heartbeat_timeout = absl::Seconds(3);
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };
  explicit WorkerRegistry(Options options) : options_(std::move(options)) {}

  // FAILED_PRECONDITION when the worker serves another model, or its KV geometry differs from the
  // workers already registered (prefill and decode workers must agree to exchange KV).
  absl::Status Register(const WorkerRegistration& worker);
  // NOT_FOUND for an unknown worker (it must register again, e.g. after a router restart).
  absl::Status Heartbeat(const std::string& address, const Heartbeat& load);
  // A failed health check (or a transport error seen by the router) marks the worker unhealthy
  // until its next heartbeat.
  void MarkUnhealthy(const std::string& address);
  // Traffic as liveness: the worker answered a call (a Decode event, a Prefill's reply), which is
  // as good a sign of life as a heartbeat, so a router too busy to take heartbeats in time does not
  // declare the workers it is hearing from dead. The load and a failed check are left as they are.
  void Heard(const std::string& address);
  void Remove(const std::string& address);

  // Workers able to serve `role` (combined workers serve both), with liveness applied.
  std::vector<WorkerLoad> Snapshot(WorkerRole role) const;
  int64_t num_live(WorkerRole role) const;
  // One worker's liveness (heard from in time, no failed check); false when unknown.
  bool IsHealthy(const std::string& address) const;

 private:
  struct Entry {
    WorkerRegistration registration;
    router::Heartbeat load;
    absl::Time last_heard;
    bool failed_check = false;
  };
  bool Alive(const Entry& e, absl::Time now) const;

  Options options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router
