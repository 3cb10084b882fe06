// The NCCL KvLink, compiled into the CUDA plugin (it needs the CUDA runtime and libnccl); processes
// reach it through CreateNcclKvLinkFactory (nccl_kv_link.h).
//
// One communicator of two ranks per control connection: the decode worker (rank 1) makes the
// ncclUniqueId, the handshake reply carries it, both ends join with a non-blocking
// ncclCommInitRankConfig. A layer moves in chunks of at most kChunkBlocks blocks, one message per
// chunk ([K of its blocks][V of its blocks], contiguous), both ends splitting the same way, on the
// link's own stream. The sender first waits (on the host) for an event recorded on the backend's
// stream, so the sends follow the layer's KV writes and the link's deadline covers only the
// transfer; it packs the chunk from its cache blocks (which stay the request's until End) into its
// staging memory with a gather kernel and sends that.
// The receiver receives each chunk into the link's staging memory and then, through the owner's
// `land`, scatters it into the reserved blocks with a kernel and waits for it (the engine reserves
// blocks between steps, whose work it has waited for, so nothing queued still reads them). Every
// wait polls the stream's completion and ncclCommGetAsyncError until done or the deadline; on
// expiry (or any NCCL error) the communicator is aborted with ncclCommAbort, which never waits for
// the peer. Late writes of an aborted receive can only reach the staging memory, freed
// stream-ordered with the link.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/kv_cache_storage.h"
#include "common/transport/kv_link.h"

namespace tandem {

class NcclKvLink final : public KvLink {
 public:
  // Blocks per message: 32 MiB of staging for a 64 KiB block.
  static constexpr int64_t kChunkBlocks = 256;
  ~NcclKvLink() override;

  absl::Status SendLayer(int32_t layer, const std::vector<int32_t>& blocks, absl::Duration timeout,
                         WorkMark* ready) override;
  absl::Status RecvLayer(int32_t layer, const std::vector<int32_t>& blocks, const Landing& land,
                         absl::Duration timeout) override;
  absl::Status DiscardLayer(int32_t num_blocks, absl::Duration timeout) override;

 private:
  friend class NcclKvLinkFactory;
  NcclKvLink(KvCacheStorage* storage, int device, int rank,
             std::shared_ptr<std::atomic<int64_t>> live)
      : storage_(storage), device_(device), rank_(rank), live_(std::move(live)) {
    ++*live_;
  }
  // Moves layer `layer` of `num_blocks` blocks, chunk by chunk: sends from `blocks`, or receives
  // into staging and lands each chunk into `blocks` through `land` (nullptr: dropped). `ready`: on
  // a send, the work the layer's KV writes are before (null: all enqueued work).
  absl::Status Move(bool send, int32_t layer, const std::vector<int32_t>& blocks,
                    int64_t num_blocks, const Landing* land, absl::Duration timeout,
                    WorkMark* ready = nullptr);
  // Packs blocks[first, first + count) of `layer` into staging (queued on the link's stream).
  absl::Status Gather(int32_t layer, const std::vector<int32_t>& blocks, int64_t first,
                      int64_t count);
  // Copies `count` staged blocks into blocks[first, first + count) of `layer` and waits for it.
  absl::Status Scatter(int32_t layer, const std::vector<int32_t>& blocks, int64_t first,
                       int64_t count);
  absl::Status GrowStaging(int64_t blocks);
  // Blocks move as 4-byte words whatever the cache's dtype (a block of a 16-bit cache holds an even
  // number of elements: head_dim is even): the words of one block.
  int64_t BlockWords() const;
  // Polls until the comm has no operation in progress and, when `event` is set, the event
  // completed.
  absl::Status WaitIdle(cudaEvent_t event, absl::Time deadline, const char* what);
  absl::Status Failed(const std::string& why);  // aborts, returns UNAVAILABLE (or the given code)
  void Abort();

  KvCacheStorage* storage_;
  int device_;
  int rank_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // this link's transfer stream
  cudaEvent_t ready_ = nullptr;    // recorded on the backend's stream before a send (its KV writes)
  cudaEvent_t done_ = nullptr;     // recorded on stream_ after each chunk
  float* staging_ = nullptr;  // [2][count][block words]: K then V of the chunk sent or received
  int64_t staging_blocks_ = 0;
  int32_t* index_ = nullptr;  // [kChunkBlocks] block ids of a gather or scatter (device)
  bool aborted_ = false;
  std::string abort_reason_;
  // The factory's count of links up (this one included)
  std::shared_ptr<std::atomic<int64_t>> live_;
};

class NcclKvLinkFactory final : public KvLinkFactory {
 public:
  // FAILED_PRECONDITION when `storage` is not CUDA memory.
  static absl::StatusOr<std::unique_ptr<NcclKvLinkFactory>> Create(KvCacheStorage* storage);
  // Versioned with the message layout: "nccl" sent one message per block, "nccl-chunks" one per
  // chunk of up to kChunkBlocks blocks; ends of different layouts refuse each other at the
  // handshake.
  std::string name() const override { return "nccl-chunks"; }
  absl::StatusOr<std::string> NewRendezvous() override;
  absl::StatusOr<std::unique_ptr<KvLink>> Join(const std::string& rendezvous, int rank,
                                               absl::Duration timeout) override;
  // Stands in for `ranks` (each a communicator of its own, on a thread of its own) until NCCL's
  // bootstrap root has heard from every rank and let go, then aborts them; kStandInTimeout at most.
  void Abandon(const std::string& rendezvous, const std::vector<int>& ranks) override;
  static constexpr absl::Duration kStandInTimeout = absl::Seconds(5);
  int64_t live_links() const override { return live_->load(); }

 private:
  NcclKvLinkFactory(KvCacheStorage* storage, int device) : storage_(storage), device_(device) {}
  KvCacheStorage* storage_;
  int device_;
  // Shared with the links, which may outlive the factory (a link being torn down at exit).
  std::shared_ptr<std::atomic<int64_t>> live_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace tandem
