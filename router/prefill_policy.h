// Chooses the prefill worker for a request: prefix affinity through bounded-load consistent hashing
// (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads"). Requests whose
// prompts share their leading blocks hash to the same point of a ring of virtual nodes, so they
// land on the worker whose prefix cache already holds those blocks — unless that worker's load
// exceeds `load_factor` × the average, in which case the walk continues to the next worker on the
// ring. Adding or removing a worker moves only the keys of its ring segments. Pure logic; not
// thread-safe (the router serialises calls).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "router/worker_load.h"

namespace tandem::router {

class PrefillPolicy {
 public:
  struct Options {
    int virtual_nodes = 64;     // ring points per worker
    double load_factor = 1.25;  // c in the bounded-load scheme (> 1)
    int affinity_blocks = 4;    // leading full blocks of the prompt that form the key
    int block_size = 16;
  };
  explicit PrefillPolicy(const Options& options);

  // Replaces the set of workers (ring rebuilt only for added or removed ids).
  void SetWorkers(const std::vector<WorkerLoad>& workers);
  // The affinity key of a prompt: a hash of its first affinity_blocks full blocks (or of the whole
  // prompt when it is shorter than one block).
  uint64_t AffinityKey(const std::vector<int32_t>& prompt) const;
  // The chosen worker id. UNAVAILABLE when no worker is healthy.
  absl::StatusOr<std::string> Choose(const std::vector<int32_t>& prompt) const;
  absl::StatusOr<std::string> ChooseForKey(uint64_t key) const;

 private:
  struct RingPoint {
    uint64_t hash;
    size_t worker;
  };
  Options options_;
  std::vector<WorkerLoad> workers_;
  std::vector<RingPoint> ring_;  // sorted by hash
};

}  // namespace tandem::router
