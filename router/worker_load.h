// What the router knows about a worker when it routes: identity, health and load, as reported by
// the worker's heartbeats. Plain data; the registry (service issue) keeps it current.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::router {

struct WorkerLoad {
  std::string id;            // stable identity, e.g. "host:port"
  bool healthy = true;       // false once heartbeats stop or health checks fail
  bool draining = false;     // alive and finishing its work, but taking nothing new
  bool kv_full = false;      // KV usage above its high-water mark: taking nothing new
  int64_t waiting = 0;       // queued requests
  int64_t running = 0;       // requests in the running batch
  int64_t free_blocks = 0;   // free KV blocks
  int64_t total_blocks = 0;  // KV pool size
  int64_t block_size = 16;   // tokens per block
};

}  // namespace tandem::router
