// The CUDA IPC KvLink, compiled into the CUDA plugin (it needs the CUDA runtime); processes reach
// it through CreateCudaIpcKvLinkFactory (cuda_ipc_kv_link.h).
//
// For a prefill and a decode worker on one machine (one GPU, or GPUs with peer access), where NCCL
// would go through its socket transport (two ranks on one GPU) at about 1 GB/s: a layer's blocks
// move at device memory bandwidth instead. One pair per control connection:
// - The decode worker (rank 1) makes the rendezvous: a listening Unix socket in the abstract
//   namespace under a random name (the handshake reply carries the name), so both ends must share a
//   network namespace (one machine, one pod, or host networking) as well as a GPU's memory.
// - The prefill worker (rank 0) connects, and sends its staging memory's cudaIpcMemHandle (staging
// of
//   up to kChunkBlocks blocks, K then V, plain cudaMalloc memory: the stream-ordered pool's cannot
//   be exported); the decode worker maps it (cudaIpcOpenMemHandle, peer access enabled lazily) and
//   says whether it could.
// - A layer moves in chunks of at most kChunkBlocks blocks. The sender waits for the layer's KV
// writes
//   (its mark), packs the chunk from its cache blocks into its staging with a gather kernel on the
//   link's stream, waits for that, and says "ready" (layer, blocks) on the socket; the receiver
//   checks the chunk is the one it expects, and through the owner's `land` scatters it from the
//   mapped staging into the reserved blocks with a kernel on its own link stream and waits for it;
//   either way it says "done", and only then may the sender pack the next chunk over it.
// Every wait is bounded by the call's deadline and watches the socket: a peer that dies closes it,
// which fails the wait at once; a silent peer meets the deadline. A failure or a timeout aborts the
// link (every later call fails) and shuts the socket, which the peer sees. No NCCL anywhere.
//
// The messages on the link's socket are fixed-size binary frames (the hello, its answer, ready and
// done), the data path's own wire format as NCCL's is its own; the KV control plane stays protobuf
// on the control connection.
//
// Teardown: freeing exported memory while another process still has it mapped is undefined, so the
// receiver unmaps (after its stream is idle) before it closes the socket, and the sender frees its
// staging only once it has seen the socket closed (the peer unmapped, or died: the driver unmaps a
// dead process's mappings). A peer that keeps the socket open past kReleaseWait (stopped, wedged)
// has its staging left allocated, with a warning: the memory is lost until the process ends, never
// reused.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backend/kv_cache_storage.h"
#include "common/transport/kv_link.h"

namespace tandem {

class CudaIpcKvLink final : public KvLink {
 public:
  // Blocks per chunk: the sender's staging holds this many (16 MiB for a 32 KiB block).
  static constexpr int64_t kChunkBlocks = 256;
  // How long a sender's teardown waits for the receiver to unmap its staging before leaving it.
  static constexpr absl::Duration kReleaseWait = absl::Seconds(2);
  ~CudaIpcKvLink() override;

  absl::Status SendLayer(int32_t layer, const std::vector<int32_t>& blocks, absl::Duration timeout,
                         WorkMark* ready) override;
  absl::Status RecvLayer(int32_t layer, const std::vector<int32_t>& blocks, const Landing& land,
                         absl::Duration timeout) override;
  absl::Status DiscardLayer(int32_t num_blocks, absl::Duration timeout) override;

 private:
  friend class CudaIpcKvLinkFactory;
  CudaIpcKvLink(KvCacheStorage* storage, int device, int rank, int fd,
                std::shared_ptr<std::atomic<int64_t>> live)
      : storage_(storage), device_(device), rank_(rank), fd_(fd), live_(std::move(live)) {
    ++*live_;
  }
  // The stream, events and index buffer both ends use; then the sender's staging (exported) or the
  // receiver's mapping of it.
  absl::Status Setup();
  absl::Status Move(bool send, int32_t layer, const std::vector<int32_t>& blocks,
                    int64_t num_blocks, const Landing* land, absl::Duration timeout,
                    WorkMark* ready = nullptr);
  // Sender (`pack`): packs blocks[first, first + count) of `layer` into staging; receiver: copies
  // `count` blocks from the mapped staging into them. Waits for the copy.
  absl::Status CopyChunk(bool pack, int32_t layer, const std::vector<int32_t>& blocks,
                         int64_t first, int64_t count, absl::Time deadline);
  // Polls `event` until it completed, the peer closed the socket, or `deadline`.
  absl::Status WaitEvent(absl::Time deadline, const char* what);
  // One frame each way, bounded by `deadline`; a closed socket is UNAVAILABLE.
  absl::Status SendFrame(uint32_t type, int32_t layer, int64_t count);
  absl::Status RecvFrame(uint32_t type, int32_t* layer, int64_t* count, absl::Time deadline,
                         const char* what);
  absl::Status Failed(absl::StatusCode code, const std::string& why);  // aborts, returns the error
  void Abort();
  // Receiver: waits for the link's stream, then unmaps the sender's staging.
  void Unmap();

  KvCacheStorage* storage_;
  int device_;
  int rank_;
  int fd_;  // the link's socket (-1 once closed)
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;  // recorded on stream_ after a gather or scatter
  // [2][staging_blocks_][block words], K then V: the sender's own, or the receiver's mapping of it.
  float* staging_ = nullptr;
  int64_t staging_blocks_ = 0;
  int32_t* index_ = nullptr;  // [kChunkBlocks] block ids of a gather or scatter (device)
  bool aborted_ = false;
  std::string abort_reason_;
  std::shared_ptr<std::atomic<int64_t>> live_;
};

class CudaIpcKvLinkFactory final : public KvLinkFactory {
 public:
  // FAILED_PRECONDITION when `storage` is not CUDA memory.
  static absl::StatusOr<std::unique_ptr<CudaIpcKvLinkFactory>> Create(KvCacheStorage* storage);
  ~CudaIpcKvLinkFactory() override;
  std::string name() const override { return "cuda-ipc"; }
  // A listening socket under a fresh random name, "tandem-kv-ipc-" and 32 hex digits.
  absl::StatusOr<std::string> NewRendezvous() override;
  // Rank 1 accepts the sender on the rendezvous' socket (then closes it) and maps its staging; rank
  // 0 connects and exports its staging.
  absl::StatusOr<std::unique_ptr<KvLink>> Join(const std::string& rendezvous, int rank,
                                               absl::Duration timeout) override;
  // Closes the rendezvous' listening socket.
  void Abandon(const std::string& rendezvous, const std::vector<int>& ranks) override;
  int64_t live_links() const override { return live_->load(); }

 private:
  CudaIpcKvLinkFactory(KvCacheStorage* storage, int device) : storage_(storage), device_(device) {}
  // Removes and returns the listening socket of `rendezvous`, or -1.
  int TakeListener(const std::string& rendezvous);
  KvCacheStorage* storage_;
  int device_;
  absl::Mutex mu_;
  std::vector<std::pair<std::string, int>> listeners_
      ABSL_GUARDED_BY(mu_);  // rendezvous not yet joined
  std::shared_ptr<std::atomic<int64_t>> live_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace tandem
