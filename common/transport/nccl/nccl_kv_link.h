// The NCCL side data path for KV layers between GPU workers (--kv-transport nccl): a KvLinkFactory
// whose links are NCCL communicators of two ranks, one per prefill→decode control connection (see
// nccl_kv_link_impl.h for how a layer moves and how every wait is bounded).
//
// Two workers on one GPU: NCCL refuses two ranks of a communicator on the same device when it
// thinks they share a host. Give each such process its own NCCL_HOSTID (--nccl-host-id; `tandem up`
// does it when all its workers share one device); the pair then talks through NCCL's network
// transport (sockets, over the interface NCCL_SOCKET_IFNAME names: `lo` for processes on one
// machine, which `tandem up` sets, since NCCL skips loopback by default). Across GPUs and nodes
// leave NCCL_HOSTID unset, so NCCL takes NVLink, PCIe peer-to-peer or InfiniBand paths.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/backend/kv_cache_storage.h"
#include "common/transport/kv_link.h"

namespace tandem {

// Links for `storage` (CUDA memory; not owned, outlives the factory). Loads the CUDA plugin.
// FAILED_PRECONDITION when the storage is not on a GPU, the plugin or libnccl cannot be loaded, or
// libnccl is older than 2.18.
absl::StatusOr<std::unique_ptr<KvLinkFactory>> CreateNcclKvLinkFactory(KvCacheStorage* storage);

}  // namespace tandem
