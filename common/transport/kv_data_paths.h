// The KV data paths a worker's --kv-transport names: a comma-separated list of "tcp" (layers inline
// on the control connection), "nccl" and "cuda-ipc" (side links, common/transport/kv_link.h).
// A prefill worker tries them in the list's order with each decode worker and keeps the first that
// works (KvControlSender::ConnectFirst); a decode worker offers every side link it names, and
// inline TCP always.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/kv_cache_storage.h"
#include "common/transport/kv_link.h"

namespace tandem {

// The names in `value`, in order. INVALID_ARGUMENT, saying why, for an empty list, an unknown name,
// a name given twice, or a name after "tcp" (inline TCP always works, so nothing after it is
// tried).
absl::StatusOr<std::vector<std::string>> ParseKvTransports(const std::string& value);

// The side link factory of `name`, "nccl" or "cuda-ipc", serving `storage` (FAILED_PRECONDITION
// when it cannot be made: not CUDA memory, the plugin or NCCL missing; INVALID_ARGUMENT for another
// name).
absl::StatusOr<std::unique_ptr<KvLinkFactory>> CreateKvLinkFactory(const std::string& name,
                                                                   KvCacheStorage* storage);

class KvDataPaths {
 public:
  // The paths `names` (ParseKvTransports) name, their side links' factories serving `storage`
  // (FAILED_PRECONDITION when one cannot be made: not CUDA memory, the plugin or NCCL missing).
  static absl::StatusOr<KvDataPaths> Create(const std::vector<std::string>& names,
                                            KvCacheStorage* storage);

  // Every named path in order, nullptr for inline TCP: what a sender tries.
  const std::vector<KvLinkFactory*>& order() const { return order_; }
  // The side links alone: what a receiver offers beside inline TCP.
  std::vector<KvLinkFactory*> links() const;
  // Links up across the side paths (the tandem_kv_links gauge).
  int64_t live_links() const;
  // "cuda-ipc, then nccl-chunks, then inline" (for logs).
  std::string Describe() const;

 private:
  std::vector<std::unique_ptr<KvLinkFactory>> owned_;
  std::vector<KvLinkFactory*> order_;
};

}  // namespace tandem
