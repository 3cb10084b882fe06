// The CUDA IPC side data path for KV layers (--kv-transport cuda-ipc): a KvLinkFactory whose links
// map the prefill worker's staging memory into the decode worker (cudaIpcOpenMemHandle), so that a
// layer moves at device memory bandwidth between two processes on one GPU, or over NVLink or PCIe
// between GPUs of one machine with peer access (see cuda_ipc_kv_link_impl.h for how a layer moves,
// how every wait is bounded and how teardown avoids freeing memory the peer still maps).
//
// Where it applies: both workers on one machine, in one network namespace (the rendezvous is an
// abstract Unix socket) and able to open each other's GPU memory (in containers: host IPC and PID
// namespaces, or one pod). Across machines use --kv-transport nccl. On one GPU it replaces NCCL's
// socket transport, which NCCL falls back to there (two ranks on one device need distinct
// NCCL_HOSTIDs), at about 1 GB/s.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/backend/kv_cache_storage.h"
#include "common/transport/kv_link.h"

namespace tandem {

// Links for `storage` (CUDA memory; not owned, outlives the factory). Loads the CUDA plugin.
// FAILED_PRECONDITION when the storage is not on a GPU or the plugin cannot be loaded.
absl::StatusOr<std::unique_ptr<KvLinkFactory>> CreateCudaIpcKvLinkFactory(KvCacheStorage* storage);

}  // namespace tandem
