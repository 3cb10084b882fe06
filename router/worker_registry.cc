#include "router/worker_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::router {

absl::Status WorkerRegistry::Register(const WorkerRegistration& w) {
  if (w.address.empty()) return absl::InvalidArgumentError("a worker registers with its address");
  if (!options_.model_fingerprint.empty() && w.model_fingerprint != options_.model_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", w.address, " serves model ",
                                                      w.model_fingerprint, ", this router serves ",
                                                      options_.model_fingerprint));
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [address, e] : workers_) {
    const WorkerRegistration& o = e.registration;
    if (address == w.address) continue;
    if (o.num_layers != w.num_layers || o.num_kv_heads != w.num_kv_heads ||
        o.head_dim != w.head_dim || o.block_size != w.block_size) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", w.address, " has a KV geometry (layers ", w.num_layers,
                       ", kv_heads ", w.num_kv_heads, ", head_dim ", w.head_dim, ", block_size ",
                       w.block_size, ") different from ", address));
    }
    // Prefill and decode workers exchange KV blocks: their caches must store the same type.
    if (o.role != WorkerRole::kCombined && w.role != WorkerRole::kCombined &&
        o.kv_dtype != w.kv_dtype) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", w.address, " keeps its KV cache in ", w.kv_dtype, " and ", address, " in ",
          o.kv_dtype, ": prefill and decode workers must agree (--kv-cache-dtype)"));
    }
  }
  Entry& e = workers_[w.address];
  e.registration = w;
  e.load.free_blocks = w.total_blocks;
  e.last_heard = options_.clock();
  e.failed_check = false;
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Heartbeat(const std::string& address, const router::Heartbeat& load) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  if (it == workers_.end())
    return absl::NotFoundError(absl::StrCat("worker ", address, " is not registered"));
  it->second.load = load;
  it->second.last_heard = options_.clock();
  it->second.failed_check = false;
  return absl::OkStatus();
}

void WorkerRegistry::MarkUnhealthy(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  if (it != workers_.end()) it->second.failed_check = true;
}

void WorkerRegistry::Heard(const std::string& address) {
  const absl::Time now = options_.clock();
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  if (it != workers_.end()) it->second.last_heard = std::max(it->second.last_heard, now);
}

void WorkerRegistry::Remove(const std::string& address) {
  absl::MutexLock lock(&mu_);
  workers_.erase(address);
}

std::vector<WorkerLoad> WorkerRegistry::Snapshot(WorkerRole role) const {
  const absl::Time now = options_.clock();
  std::vector<WorkerLoad> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [address, e] : workers_) {
    const WorkerRole r = e.registration.role;
    if (r != role && r != WorkerRole::kCombined) continue;
    WorkerLoad w;
    w.id = address;
    w.healthy = Alive(e, now);
    w.draining = e.load.draining;
    w.kv_full = e.load.kv_full;
    w.waiting = e.load.waiting;
    w.running = e.load.running;
    w.free_blocks = e.load.free_blocks;
    w.total_blocks = e.registration.total_blocks;
    w.block_size = e.registration.block_size;
    out.push_back(std::move(w));
  }
  std::sort(out.begin(), out.end(),
            [](const WorkerLoad& a, const WorkerLoad& b) { return a.id < b.id; });
  return out;
}

bool WorkerRegistry::Alive(const Entry& e, absl::Time now) const {
  return !e.failed_check && now - e.last_heard <= options_.heartbeat_timeout;
}

bool WorkerRegistry::IsHealthy(const std::string& address) const {
  const absl::Time now = options_.clock();
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  return it != workers_.end() && Alive(it->second, now);
}

int64_t WorkerRegistry::num_live(WorkerRole role) const {
  int64_t n = 0;
  for (const WorkerLoad& w : Snapshot(role)) n += w.healthy;
  return n;
}

}  // namespace tandem::router
