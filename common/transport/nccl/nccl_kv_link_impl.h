// The NCCL KvLink, compiled into the CUDA plugin (it needs the CUDA runtime and libnccl); processes
// reach it through CreateNcclKvLinkFactory (nccl_kv_link.h).
//
// One communicator of two ranks per control connection: the decode worker (rank 1) makes the
// ncclUniqueId, the handshake reply carries it, both ends join with a non-blocking
// ncclCommInitRankConfig. Every layer is one or more groups of ncclSend / ncclRecv, one per K block
// then one per V block (at most kMaxOpsPerGroup operations per group, NCCL's limit being 2048), on
// the link's own stream. Sends wait, on the device, for an event recorded on the backend's stream,
// so they follow the layer's KV writes without blocking the host on the whole step. Each call then
// polls the stream's completion and ncclCommGetAsyncError until done or its timeout; on expiry (or
// any NCCL error) the communicator is aborted with ncclCommAbort, which never waits for the peer.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/kv_cache_storage.h"
#include "common/transport/kv_link.h"

namespace tandem {

class NcclKvLink final : public KvLink {
 public:
  static constexpr int kMaxOpsPerGroup = 1024;
  ~NcclKvLink() override;

  absl::Status SendLayer(int32_t layer, const std::vector<int32_t>& blocks, absl::Duration timeout) override;
  absl::Status RecvLayer(int32_t layer, const std::vector<int32_t>& blocks, absl::Duration timeout) override;
  absl::Status DiscardLayer(int32_t num_blocks, absl::Duration timeout) override;

 private:
  friend class NcclKvLinkFactory;
  NcclKvLink(KvCacheStorage* storage, int device, int rank) : storage_(storage), device_(device), rank_(rank) {}
  // Enqueues K then V of `blocks` of `layer` (discard: `blocks` are only counted, every receive lands
  // in scratch_), grouped, then waits for all of it.
  absl::Status Move(bool send, int32_t layer, const std::vector<int32_t>& blocks, bool discard, absl::Duration timeout);
  // Polls until the comm has no operation in progress and, when `event` is set, the event completed.
  absl::Status WaitIdle(cudaEvent_t event, absl::Time deadline, const char* what);
  absl::Status Failed(const std::string& why);  // aborts, returns UNAVAILABLE (or the given code)
  void Abort();

  KvCacheStorage* storage_;
  int device_;
  int rank_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;   // this link's transfer stream
  cudaEvent_t ready_ = nullptr;     // recorded on the backend's stream before each send
  cudaEvent_t done_ = nullptr;      // recorded on stream_ after each layer
  float* scratch_ = nullptr;        // [block elems]: where discarded layers land
  bool aborted_ = false;
  std::string abort_reason_;
};

class NcclKvLinkFactory final : public KvLinkFactory {
 public:
  // FAILED_PRECONDITION when `storage` is not CUDA memory.
  static absl::StatusOr<std::unique_ptr<NcclKvLinkFactory>> Create(KvCacheStorage* storage);
  std::string name() const override { return "nccl"; }
  absl::StatusOr<std::string> NewRendezvous() override;
  absl::StatusOr<std::unique_ptr<KvLink>> Join(const std::string& rendezvous, int rank, absl::Duration timeout) override;

 private:
  NcclKvLinkFactory(KvCacheStorage* storage, int device) : storage_(storage), device_(device) {}
  KvCacheStorage* storage_;
  int device_;
};

}  // namespace tandem
