// Paged causal attention on the CPU: the new keys and values go into their cache slots, then every
// query row attends over its sequence's blocks.
//
// The work is split into items of one sequence, one KV head and a tile of up to kQueryTile of its
// tokens: the item's query rows (tokens × the query heads that share the KV head) read each key and
// value once, converted to f32 in chunks of 16 positions, instead of once per row. Each row's
// arithmetic is fixed by the row alone (its query, its context length, the cache): scores are dot
// products over head_dim in vector lanes with one fixed reduction, softmax is two passes (max, then
// exp with the denominator summed in double in position order), and the values are accumulated in
// position order. So a token's output is the same bits whether it is decoded alone, batched with
// others, or recomputed in any chunk of a prefill (the engine's batch invariance); it differs
// between the AVX-512, AVX2 and portable paths, which a process does not mix.
#pragma once

#include <cstdint>

#include "common/backend/backend.h"
#include "common/base/thread_pool.h"

namespace tandem::cpu {

// Tokens of one sequence that share an item.
inline constexpr int64_t kQueryTile = 16;

// As Backend::PagedAttention (backend.h): q [num_tokens][num_q_heads][head_dim], k and v
// [num_tokens][num_kv_heads][head_dim], out as q; the caches hold every layer (geometry g).
void PagedAttention(ThreadPool& pool, const float* q, const float* k, const float* v, void* k_cache,
                    void* v_cache, const KvCacheGeometry& g, int64_t layer,
                    const AttentionMetadata& md, int64_t num_q_heads, float scale, float* out);

}  // namespace tandem::cpu
