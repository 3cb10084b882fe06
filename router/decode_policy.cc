#include "router/decode_policy.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem::router {

absl::StatusOr<std::string> ChooseDecodeWorker(const std::vector<WorkerLoad>& workers,
                                               const DecodeDemand& demand) {
  int64_t healthy = 0, total_sequences = 0;
  for (const WorkerLoad& w : workers) {
    if (!w.healthy) continue;
    ++healthy;
    total_sequences += w.running + w.waiting;
  }
  const WorkerLoad* best = nullptr;
  double best_score = 0;
  for (const WorkerLoad& w : workers) {
    if (!w.healthy) continue;
    const int64_t bs = std::max<int64_t>(w.block_size, 1);
    const int64_t tokens =
        demand.prompt_tokens +
        static_cast<int64_t>(std::ceil(demand.output_headroom * demand.max_output_tokens));
    const int64_t need = (std::max<int64_t>(tokens, 1) + bs - 1) / bs;
    if (w.free_blocks < need) continue;
    const double kv_usage = w.total_blocks > 0 ? 1.0 - static_cast<double>(w.free_blocks) /
                                                           static_cast<double>(w.total_blocks)
                                               : 0.0;
    const double sequence_share =
        static_cast<double>(w.running + w.waiting) / static_cast<double>(total_sequences + 1);
    const double score = kv_usage + sequence_share;
    if (best == nullptr || score < best_score) {
      best = &w;
      best_score = score;
    }
  }
  if (healthy == 0) return absl::UnavailableError("no healthy decode worker");
  if (best == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no decode worker has KV room for ", demand.prompt_tokens, " prompt tokens; retry later"));
  }
  return best->id;
}

}  // namespace tandem::router
