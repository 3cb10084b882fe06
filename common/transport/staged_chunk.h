// What both GPU KV links (nccl/, cuda_ipc/) do to a chunk of a layer: copy it between the cache
// blocks and the link's staging memory, laid out [2][count][block words] (K of the chunk's blocks,
// then their V). Plugin code: it needs the CUDA runtime and the backend's kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common/backend/cuda/kernels.h"
#include "common/backend/kv_cache_storage.h"

namespace tandem {

// Enqueues on `stream`, after uploading blocks[first, first + count) into `index` (device memory
// for at least `count` ids): with `pack`, the blocks of layer `layer` of `storage` gathered into
// `staging`; without, `staging` scattered into them. Blocks move as 4-byte words whatever the
// cache's dtype (the links refuse caches whose blocks are not whole words).
inline cudaError_t EnqueueChunkCopy(bool pack, KvCacheStorage* storage, int32_t layer,
                                    const std::vector<int32_t>& blocks, int64_t first,
                                    int64_t count, int32_t* index, float* staging,
                                    cudaStream_t stream) {
  const int64_t words = storage->geometry().bytes_per_block() / 4;
  cudaError_t err =
      cudaMemcpyAsync(index, blocks.data() + first, static_cast<size_t>(count) * sizeof(int32_t),
                      cudaMemcpyHostToDevice, stream);
  for (bool v : {false, true}) {
    if (err != cudaSuccess) break;
    auto* cache = reinterpret_cast<float*>(storage->layer_data(v, layer));
    float* chunk = staging + (v ? count * words : 0);
    err = pack ? cuda::LaunchGatherRows(cache, index, count, words, chunk, stream)
               : cuda::LaunchScatterBlocks(chunk, index, count, words, cache, stream);
  }
  return err;
}

}  // namespace tandem
