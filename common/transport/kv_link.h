// A side data path for KV layers, beside a KV transport's control connection: NCCL between GPU
// workers (common/transport/nccl/). The control connection still carries everything else
// (handshake, Begin, one KvLayerHeader per layer, End, Ack); after each layer header both ends move
// that layer over the link, so sends and receives pair up one to one, in header order.
//
// Calls are synchronous: each returns once its layer moved (send: handed to the peer; receive:
// landed or dropped) or failed. A failed or timed-out call aborts the link, and every later call
// fails: the owner then drops the control connection with it, which the peer sees. Destruction
// tears the link down (an NCCL communicator is aborted, never waited on). One thread uses a link at
// a time.
//
// Receiving never writes into cache blocks on its own: data lands in the link's staging memory, and
// the owner decides, under whatever lock keeps the blocks reserved, whether it goes into the blocks
// (`land`). A cancelled reservation can therefore be released at once: an abort, a timeout or a
// late arrival can only ever touch the link's own memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/backend/backend.h"

namespace tandem {

class KvLink {
 public:
  virtual ~KvLink() = default;
  // Sends layer `layer` of `blocks` (K blocks in order, then V blocks) of the factory's storage,
  // after the layer's KV writes: the work before `ready` (Backend::Mark, taken when they were
  // enqueued), or with `ready` null every op enqueued on the storage's backend before the call.
  virtual absl::Status SendLayer(int32_t layer, const std::vector<int32_t>& blocks,
                                 absl::Duration timeout, WorkMark* ready) = 0;
  // Receives a layer sent as above (K then V of `blocks.size()` blocks). Piece by piece, as each
  // lands in staging, calls `land(write)`: the owner calls `write()` (which copies that piece into
  // its blocks of the factory's storage and waits for the copy) only while `blocks` are still the
  // transfer's, and holds its lock meanwhile. An owner that no longer wants the layer never calls
  // it.
  using Landing = std::function<void(const std::function<void()>& write)>;
  virtual absl::Status RecvLayer(int32_t layer, const std::vector<int32_t>& blocks,
                                 const Landing& land, absl::Duration timeout) = 0;
  // Receives a layer of `num_blocks` blocks and drops it: its transfer was cancelled, but the
  // sender's sends still need their receives.
  virtual absl::Status DiscardLayer(int32_t num_blocks, absl::Duration timeout) = 0;
};

// What a link checks of a layer move before it touches memory: the layer exists, `num_blocks` fit
// the pool and every block id is in it. Empty when fine, else why.
inline std::string LayerMoveProblem(const KvCacheGeometry& g, int32_t layer,
                                    const std::vector<int32_t>& blocks, int64_t num_blocks) {
  if (layer < 0 || layer >= g.num_layers) return "layer " + std::to_string(layer) + " out of range";
  if (num_blocks < 0 || num_blocks > g.num_blocks)
    return std::to_string(num_blocks) + " blocks do not fit the pool";
  for (int32_t b : blocks) {
    if (b < 0 || b >= g.num_blocks) return "block " + std::to_string(b) + " outside the pool";
  }
  return "";
}

// Makes links for one process's KV cache. Thread-safe.
class KvLinkFactory {
 public:
  virtual ~KvLinkFactory() = default;
  // The data path's name in handshakes ("nccl-chunks"), which also names its message layout.
  virtual std::string name() const = 0;
  // Receiver side: a fresh token for one sender–receiver pair (an ncclUniqueId), which the
  // handshake reply carries to the sender.
  virtual absl::StatusOr<std::string> NewRendezvous() = 0;
  // Both ends join the pair named by `rendezvous`: rank 0 is the sender, 1 the receiver. Returns
  // once both joined; DEADLINE_EXCEEDED after `timeout` (nothing is left behind), INVALID_ARGUMENT
  // for a malformed token.
  virtual absl::StatusOr<std::unique_ptr<KvLink>> Join(const std::string& rendezvous, int rank,
                                                       absl::Duration timeout) = 0;
  // Receiver side: the pair named by `rendezvous` will not form (the handshake failed, or a join
  // timed out), and `ranks` never joined it from this process or will not now. Whatever the
  // rendezvous started waits for them no longer: NCCL's bootstrap root, started by NewRendezvous,
  // waits for every rank with no timeout of its own, so the NCCL factory stands in for the missing
  // ranks and aborts. Blocks for at most a few seconds.
  virtual void Abandon(const std::string& /*rendezvous*/, const std::vector<int>& /*ranks*/) {}
  // Links this factory made that are still up (not yet destroyed): this process's ends of its
  // pairs, each an NCCL communicator with its staging memory (the tandem_kv_links gauge).
  // Thread-safe.
  virtual int64_t live_links() const { return 0; }
};

}  // namespace tandem
