#include "router/prefill_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/kv/block_pool.h"

namespace tandem::router {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

uint64_t HashString(const std::string& s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return Mix(h);
}

}  // namespace

PrefillPolicy::PrefillPolicy(const Options& options) : options_(options) {
  options_.virtual_nodes = std::max(1, options_.virtual_nodes);
  options_.load_factor = std::max(1.0, options_.load_factor);
  options_.affinity_blocks = std::max(1, options_.affinity_blocks);
  options_.block_size = std::max(1, options_.block_size);
}

void PrefillPolicy::SetWorkers(const std::vector<WorkerLoad>& workers) {
  workers_ = workers;
  ring_.clear();
  for (size_t w = 0; w < workers_.size(); ++w) {
    for (int v = 0; v < options_.virtual_nodes; ++v) {
      ring_.push_back({HashString(workers_[w].id, static_cast<uint64_t>(v)), w});
    }
  }
  std::sort(ring_.begin(), ring_.end(),
            [](const RingPoint& a, const RingPoint& b) { return a.hash < b.hash; });
}

uint64_t PrefillPolicy::AffinityKey(const std::vector<int32_t>& prompt) const {
  const int64_t bs = options_.block_size;
  const int64_t full = static_cast<int64_t>(prompt.size()) / bs;
  const int64_t blocks = std::min<int64_t>(full, options_.affinity_blocks);
  if (blocks == 0) return Mix(HashBlock(0, prompt.data(), static_cast<int64_t>(prompt.size()), 1));
  uint64_t h = 0;
  for (int64_t b = 0; b < blocks; ++b) h = HashBlock(h, prompt.data() + b * bs, bs, 0);
  return Mix(h);
}

absl::StatusOr<std::string> PrefillPolicy::Choose(const std::vector<int32_t>& prompt) const {
  return ChooseForKey(AffinityKey(prompt));
}

absl::StatusOr<std::string> PrefillPolicy::ChooseForKey(uint64_t key) const {
  int64_t healthy = 0, total_load = 0;
  for (const WorkerLoad& w : workers_) {
    if (!w.healthy) continue;
    ++healthy;
    total_load += w.waiting + w.running;
  }
  if (healthy == 0) return absl::UnavailableError("no healthy prefill worker");
  // Bounded load: no worker may take the request if that puts it above c × the average load
  // (counting the new request).
  const double bound =
      options_.load_factor * static_cast<double>(total_load + 1) / static_cast<double>(healthy);
  auto start = std::lower_bound(ring_.begin(), ring_.end(), key,
                                [](const RingPoint& p, uint64_t k) { return p.hash < k; });
  const size_t first = static_cast<size_t>(start - ring_.begin());
  const WorkerLoad* fallback = nullptr;
  for (size_t i = 0; i < ring_.size(); ++i) {
    const WorkerLoad& w = workers_[ring_[(first + i) % ring_.size()].worker];
    if (!w.healthy) continue;
    if (static_cast<double>(w.waiting + w.running + 1) <= bound) return w.id;
    if (fallback == nullptr || w.waiting + w.running < fallback->waiting + fallback->running)
      fallback = &w;
  }
  return fallback->id;  // every healthy worker is above the bound: the least loaded
}

}  // namespace tandem::router
