#include "router/decode_policy.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem::router {

absl::StatusOr<std::string> ChooseDecodeWorker(const std::vector<WorkerLoad>& workers,
                                               const DecodeDemand& demand) {
  const WorkerLoad* best = nullptr;
  int64_t healthy = 0;
  for (const WorkerLoad& w : workers) {
    if (!w.healthy) continue;
    ++healthy;
    const int64_t bs = std::max<int64_t>(w.block_size, 1);
    const int64_t tokens = demand.prompt_tokens +
                           static_cast<int64_t>(std::ceil(demand.output_headroom * demand.max_output_tokens));
    const int64_t need = (std::max<int64_t>(tokens, 1) + bs - 1) / bs;
    if (w.free_blocks < need) continue;
    if (best == nullptr || w.free_blocks > best->free_blocks ||
        (w.free_blocks == best->free_blocks && w.running < best->running)) {
      best = &w;
    }
  }
  if (healthy == 0) return absl::UnavailableError("no healthy decode worker");
  if (best == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("no decode worker has KV room for ", demand.prompt_tokens,
                                                     " prompt tokens; retry later"));
  }
  return best->id;
}

}  // namespace tandem::router
