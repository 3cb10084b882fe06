#include "common/transport/nccl/nccl_kv_link_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/transport/staged_chunk.h"

namespace tandem {
namespace {

bool Ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

std::string CudaError(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

}  // namespace

// ---------------------------------------------------------------- link

NcclKvLink::~NcclKvLink() {
  cudaSetDevice(device_);
  Abort();  // teardown never waits for the peer, which may be gone
  // Stream-ordered frees: after whatever an aborted operation still does, and no device-wide sync.
  if (staging_ != nullptr) cudaFreeAsync(staging_, stream_);
  if (index_ != nullptr) cudaFreeAsync(index_, stream_);
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  --*live_;
}

void NcclKvLink::Abort() {
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  aborted_ = true;
}

absl::Status NcclKvLink::Failed(const std::string& why) {
  const std::string detail = comm_ != nullptr ? ncclGetLastError(comm_) : "";
  abort_reason_ = absl::StrCat("NCCL KV link: ", why, detail.empty() ? "" : ": ", detail);
  Abort();
  return absl::UnavailableError(abort_reason_);
}

absl::Status NcclKvLink::WaitIdle(cudaEvent_t event, absl::Time deadline, const char* what) {
  int sleep_us = 10;
  while (true) {
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) {
      return Failed(absl::StrCat(what, ": ncclCommGetAsyncError: ", ncclGetErrorString(r)));
    }
    if (!Ok(state)) return Failed(absl::StrCat(what, ": ", ncclGetErrorString(state)));
    if (state == ncclSuccess) {
      if (event == nullptr) return absl::OkStatus();
      const cudaError_t q = cudaEventQuery(event);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return Failed(absl::StrCat(what, ": ", CudaError(q)));
    }
    if (absl::Now() >= deadline) {
      abort_reason_ =
          absl::StrCat("NCCL KV link: ", what, " timed out (the communicator was aborted)");
      Abort();
      return absl::DeadlineExceededError(abort_reason_);
    }
    ::usleep(sleep_us);
    sleep_us = std::min(sleep_us * 2, 200);
  }
}

absl::Status NcclKvLink::GrowStaging(int64_t blocks) {
  if (blocks <= staging_blocks_) return absl::OkStatus();
  if (staging_ != nullptr) cudaFreeAsync(staging_, stream_);
  staging_ = nullptr;
  staging_blocks_ = 0;
  const size_t bytes = 2 * static_cast<size_t>(blocks) * storage_->geometry().bytes_per_block();
  if (cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&staging_), bytes, stream_);
      e != cudaSuccess) {
    staging_ = nullptr;
    return Failed(absl::StrCat("allocating ", bytes, " bytes of staging: ", CudaError(e)));
  }
  staging_blocks_ = blocks;
  return absl::OkStatus();
}

absl::Status NcclKvLink::Scatter(int32_t layer, const std::vector<int32_t>& blocks, int64_t first,
                                 int64_t count) {
  // No wait on the backend's stream: the engine reserves blocks between steps, and every step ends
  // by waiting for its work, so nothing queued still reads blocks a reservation handed out.
  // (Recording on that stream from here could also land inside a graph capture of the engine
  // thread.)
  cudaError_t err = EnqueueChunkCopy(/*pack=*/false, storage_, layer, blocks, first, count, index_,
                                     staging_, stream_);
  if (err == cudaSuccess) err = cudaEventRecord(done_, stream_);
  if (err == cudaSuccess) err = cudaEventSynchronize(done_);  // device-local copies: short
  return err == cudaSuccess ? absl::OkStatus()
                            : Failed(absl::StrCat("landing a layer: ", CudaError(err)));
}

int64_t NcclKvLink::BlockWords() const { return storage_->geometry().bytes_per_block() / 4; }

absl::Status NcclKvLink::Gather(int32_t layer, const std::vector<int32_t>& blocks, int64_t first,
                                int64_t count) {
  // Stream-ordered on the link's stream, before the send that reads the staging memory.
  const cudaError_t err = EnqueueChunkCopy(/*pack=*/true, storage_, layer, blocks, first, count,
                                           index_, staging_, stream_);
  return err == cudaSuccess ? absl::OkStatus()
                            : Failed(absl::StrCat("packing a layer: ", CudaError(err)));
}

absl::Status NcclKvLink::Move(bool send, int32_t layer, const std::vector<int32_t>& blocks,
                              int64_t num_blocks, const Landing* land, absl::Duration timeout,
                              WorkMark* ready) {
  if (aborted_)
    return absl::UnavailableError(abort_reason_.empty() ? "NCCL KV link: aborted" : abort_reason_);
  if (const std::string why = LayerMoveProblem(storage_->geometry(), layer, blocks, num_blocks);
      !why.empty()) {
    return Failed(why);
  }
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return Failed(CudaError(e));
  if (send && ready != nullptr) {
    // The layer's KV writes, marked when they were enqueued: later layers and steps may be
    // computing.
    RETURN_IF_ERROR(ready->Wait(absl::Now() + timeout));
  } else if (send) {
    // The layer's KV writes are queued on the backend's stream: wait for them here (and whatever
    // was queued after them), so the deadline below measures the transfer alone.
    auto* compute = static_cast<cudaStream_t>(storage_->backend()->native_stream());
    cudaError_t e = cudaEventRecord(ready_, compute);
    if (e == cudaSuccess) e = cudaEventSynchronize(ready_);
    if (e != cudaSuccess) return Failed(CudaError(e));
  }
  const absl::Time deadline = absl::Now() + timeout;
  const int64_t e = BlockWords();
  const int peer = 1 - rank_;
  for (int64_t first = 0; first < num_blocks; first += kChunkBlocks) {
    const int64_t count = std::min<int64_t>(kChunkBlocks, num_blocks - first);
    RETURN_IF_ERROR(GrowStaging(count));
    if (send) RETURN_IF_ERROR(Gather(layer, blocks, first, count));
    // One message a chunk, [K of its blocks][V of its blocks], both ends alike: per-block messages
    // of a few KiB ran NCCL's socket path at under 1 GB/s on an H200.
    const size_t floats = static_cast<size_t>(2 * count * e);
    const ncclResult_t r = send ? ncclSend(staging_, floats, ncclFloat, peer, comm_, stream_)
                                : ncclRecv(staging_, floats, ncclFloat, peer, comm_, stream_);
    if (!Ok(r))
      return Failed(absl::StrCat(send ? "ncclSend: " : "ncclRecv: ", ncclGetErrorString(r)));
    // A non-blocking communicator may still be enqueueing the group.
    RETURN_IF_ERROR(WaitIdle(nullptr, deadline, send ? "enqueueing sends" : "enqueueing receives"));
    if (cudaError_t err = cudaEventRecord(done_, stream_); err != cudaSuccess)
      return Failed(CudaError(err));
    RETURN_IF_ERROR(WaitIdle(done_, deadline, send ? "sending a layer" : "receiving a layer"));
    if (!send && land != nullptr) {
      absl::Status landed;
      (*land)([&] { landed = Scatter(layer, blocks, first, count); });
      RETURN_IF_ERROR(landed);
    }
  }
  return absl::OkStatus();
}

absl::Status NcclKvLink::SendLayer(int32_t layer, const std::vector<int32_t>& blocks,
                                   absl::Duration timeout, WorkMark* ready) {
  return Move(true, layer, blocks, static_cast<int64_t>(blocks.size()), nullptr, timeout, ready);
}

absl::Status NcclKvLink::RecvLayer(int32_t layer, const std::vector<int32_t>& blocks,
                                   const Landing& land, absl::Duration timeout) {
  return Move(false, layer, blocks, static_cast<int64_t>(blocks.size()), &land, timeout);
}

absl::Status NcclKvLink::DiscardLayer(int32_t num_blocks, absl::Duration timeout) {
  return Move(false, 0, {}, num_blocks, nullptr, timeout);
}

// ---------------------------------------------------------------- factory

absl::StatusOr<std::unique_ptr<NcclKvLinkFactory>> NcclKvLinkFactory::Create(
    KvCacheStorage* storage) {
  if (storage == nullptr || storage->backend()->native_stream() == nullptr ||
      storage->backend()->device_ordinal() < 0) {
    return absl::FailedPreconditionError(
        "--kv-transport nccl needs the KV cache in CUDA memory (--device cuda)");
  }
  if (storage->geometry().bytes_per_block() % 4 != 0) {
    return absl::FailedPreconditionError(
        "--kv-transport nccl moves KV blocks as 4-byte words: this cache's blocks are "
        "not a whole number of them (an odd head_dim with a 16-bit cache)");
  }
  int version = 0;
  ncclGetVersion(&version);
  if (version < NCCL_VERSION(2, 18, 0)) {
    return absl::FailedPreconditionError(absl::StrCat("NCCL ", version,
                                                      " is too old: non-blocking communicators "
                                                      "with abort need 2.18 or newer"));
  }
  return std::unique_ptr<NcclKvLinkFactory>(
      new NcclKvLinkFactory(storage, storage->backend()->device_ordinal()));
}

absl::StatusOr<std::string> NcclKvLinkFactory::NewRendezvous() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return absl::UnavailableError(
        absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r), ": ", ncclGetLastError(nullptr)));
  }
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<std::unique_ptr<KvLink>> NcclKvLinkFactory::Join(const std::string& rendezvous,
                                                                int rank, absl::Duration timeout) {
  ncclUniqueId id;
  if (rendezvous.size() != sizeof(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("an NCCL unique id has ", sizeof(id), " bytes, not ", rendezvous.size()));
  }
  if (rank != 0 && rank != 1)
    return absl::InvalidArgumentError("rank must be 0 (sender) or 1 (receiver)");
  std::memcpy(&id, rendezvous.data(), sizeof(id));
  const absl::Time deadline = absl::Now() + timeout;
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
    return absl::InternalError(CudaError(e));
  std::unique_ptr<NcclKvLink> link(new NcclKvLink(storage_, device_, rank, live_));
  if (cudaError_t e = cudaStreamCreateWithFlags(&link->stream_, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaStreamCreate: ", CudaError(e)));
  }
  if (cudaError_t e = cudaEventCreateWithFlags(&link->ready_, cudaEventDisableTiming);
      e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaEventCreate: ", CudaError(e)));
  }
  if (cudaError_t e = cudaEventCreateWithFlags(&link->done_, cudaEventDisableTiming);
      e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaEventCreate: ", CudaError(e)));
  }
  if (cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&link->index_),
                                      NcclKvLink::kChunkBlocks * sizeof(int32_t), link->stream_);
      e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat("cudaMallocAsync: ", CudaError(e)));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait below is ours, with a deadline
  if (ncclResult_t r = ncclCommInitRankConfig(&link->comm_, 2, id, rank, &config); !Ok(r)) {
    return link->Failed(absl::StrCat("ncclCommInitRankConfig: ", ncclGetErrorString(r)));
  }
  RETURN_IF_ERROR(link->WaitIdle(nullptr, deadline, "joining the communicator"));
  return std::unique_ptr<KvLink>(std::move(link));
}

void NcclKvLinkFactory::Abandon(const std::string& rendezvous, const std::vector<int>& ranks) {
  ncclUniqueId id;
  if (rendezvous.size() != sizeof(id)) return;
  std::memcpy(&id, rendezvous.data(), sizeof(id));
  const absl::Time deadline = absl::Now() + kStandInTimeout;
  std::vector<std::thread> stand_ins;
  for (int rank : ranks) {
    if (rank != 0 && rank != 1) continue;
    // Initialisation returns only once every rank has reached the root, so each rank has a thread.
    stand_ins.emplace_back([this, id, rank, deadline] {
      cudaSetDevice(device_);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclComm_t comm = nullptr;
      ncclResult_t state = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
      // In progress until the root has answered (and the ranks failed to pair, or did): then abort.
      int sleep_us = 100;
      while (comm != nullptr && state == ncclInProgress && absl::Now() < deadline) {
        ::usleep(sleep_us);
        sleep_us = std::min(sleep_us * 2, 5000);
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
      }
      if (comm != nullptr) ncclCommAbort(comm);
    });
  }
  for (std::thread& t : stand_ins) t.join();
}

}  // namespace tandem
