#include "common/transport/nccl/nccl_kv_link_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

bool Ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

std::string CudaError(cudaError_t e) { return absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"); }

}  // namespace

// ---------------------------------------------------------------- link

NcclKvLink::~NcclKvLink() {
  cudaSetDevice(device_);
  Abort();  // teardown never waits for the peer, which may be gone
  if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);  // stream-ordered: no device-wide sync
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
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
      abort_reason_ = absl::StrCat("NCCL KV link: ", what, " timed out (the communicator was aborted)");
      Abort();
      return absl::DeadlineExceededError(abort_reason_);
    }
    ::usleep(sleep_us);
    sleep_us = std::min(sleep_us * 2, 200);
  }
}

absl::Status NcclKvLink::Move(bool send, int32_t layer, const std::vector<int32_t>& blocks, bool discard,
                              absl::Duration timeout) {
  if (aborted_) return absl::UnavailableError(abort_reason_.empty() ? "NCCL KV link: aborted" : abort_reason_);
  const absl::Time deadline = absl::Now() + timeout;
  const KvCacheGeometry& g = storage_->geometry();
  if (layer < 0 || layer >= g.num_layers) return Failed(absl::StrCat("layer ", layer, " out of range"));
  if (!discard) {
    for (int32_t b : blocks) {
      if (b < 0 || b >= g.num_blocks) return Failed(absl::StrCat("block ", b, " outside the pool"));
    }
  }
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return Failed(CudaError(e));
  if (send) {
    // After the layer's KV writes: everything enqueued on the backend's stream so far.
    auto* compute = static_cast<cudaStream_t>(storage_->backend()->native_stream());
    if (cudaError_t e = cudaEventRecord(ready_, compute); e != cudaSuccess) return Failed(CudaError(e));
    if (cudaError_t e = cudaStreamWaitEvent(stream_, ready_, 0); e != cudaSuccess) return Failed(CudaError(e));
  }
  const int64_t e = g.elements_per_block();
  float* k = storage_->k() + layer * g.elements_per_layer();
  float* v = storage_->v() + layer * g.elements_per_layer();
  const int64_t n = static_cast<int64_t>(blocks.size());
  const int peer = 1 - rank_;
  // Op i < n moves K of blocks[i], op n + i V of blocks[i]; both ends split the ops into the same groups.
  for (int64_t first = 0; first < 2 * n; first += kMaxOpsPerGroup) {
    if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return Failed(ncclGetErrorString(r));
    ncclResult_t r = ncclSuccess;
    for (int64_t i = first; i < std::min<int64_t>(2 * n, first + kMaxOpsPerGroup) && Ok(r); ++i) {
      float* p = discard ? scratch_ : (i < n ? k + blocks[i] * e : v + blocks[i - n] * e);
      r = send ? ncclSend(p, static_cast<size_t>(e), ncclFloat, peer, comm_, stream_)
               : ncclRecv(p, static_cast<size_t>(e), ncclFloat, peer, comm_, stream_);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (!Ok(r) || !Ok(end)) return Failed(absl::StrCat(send ? "ncclSend: " : "ncclRecv: ", ncclGetErrorString(Ok(r) ? end : r)));
    // A non-blocking communicator may still be enqueueing the group.
    RETURN_IF_ERROR(WaitIdle(nullptr, deadline, send ? "enqueueing sends" : "enqueueing receives"));
  }
  if (cudaError_t err = cudaEventRecord(done_, stream_); err != cudaSuccess) return Failed(CudaError(err));
  return WaitIdle(done_, deadline, send ? "sending a layer" : "receiving a layer");
}

absl::Status NcclKvLink::SendLayer(int32_t layer, const std::vector<int32_t>& blocks, absl::Duration timeout) {
  return Move(true, layer, blocks, false, timeout);
}

absl::Status NcclKvLink::RecvLayer(int32_t layer, const std::vector<int32_t>& blocks, absl::Duration timeout) {
  return Move(false, layer, blocks, false, timeout);
}

absl::Status NcclKvLink::DiscardLayer(int32_t num_blocks, absl::Duration timeout) {
  if (num_blocks < 0 || num_blocks > storage_->geometry().num_blocks) {
    return Failed(absl::StrCat("cannot discard ", num_blocks, " blocks"));
  }
  return Move(false, 0, std::vector<int32_t>(static_cast<size_t>(num_blocks), 0), true, timeout);
}

// ---------------------------------------------------------------- factory

absl::StatusOr<std::unique_ptr<NcclKvLinkFactory>> NcclKvLinkFactory::Create(KvCacheStorage* storage) {
  if (storage == nullptr || storage->backend()->native_stream() == nullptr || storage->backend()->device_ordinal() < 0) {
    return absl::FailedPreconditionError("--kv-transport nccl needs the KV cache in CUDA memory (--device cuda)");
  }
  int version = 0;
  ncclGetVersion(&version);
  if (version < NCCL_VERSION(2, 18, 0)) {
    return absl::FailedPreconditionError(absl::StrCat("NCCL ", version, " is too old: non-blocking communicators "
                                                      "with abort need 2.18 or newer"));
  }
  return std::unique_ptr<NcclKvLinkFactory>(new NcclKvLinkFactory(storage, storage->backend()->device_ordinal()));
}

absl::StatusOr<std::string> NcclKvLinkFactory::NewRendezvous() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r), ": ", ncclGetLastError(nullptr)));
  }
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<std::unique_ptr<KvLink>> NcclKvLinkFactory::Join(const std::string& rendezvous, int rank,
                                                                absl::Duration timeout) {
  ncclUniqueId id;
  if (rendezvous.size() != sizeof(id)) {
    return absl::InvalidArgumentError(absl::StrCat("an NCCL unique id has ", sizeof(id), " bytes, not ", rendezvous.size()));
  }
  if (rank != 0 && rank != 1) return absl::InvalidArgumentError("rank must be 0 (sender) or 1 (receiver)");
  std::memcpy(&id, rendezvous.data(), sizeof(id));
  const absl::Time deadline = absl::Now() + timeout;
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return absl::InternalError(CudaError(e));
  std::unique_ptr<NcclKvLink> link(new NcclKvLink(storage_, device_, rank));
  if (cudaError_t e = cudaStreamCreateWithFlags(&link->stream_, cudaStreamNonBlocking); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaStreamCreate: ", CudaError(e)));
  }
  if (cudaError_t e = cudaEventCreateWithFlags(&link->ready_, cudaEventDisableTiming); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaEventCreate: ", CudaError(e)));
  }
  if (cudaError_t e = cudaEventCreateWithFlags(&link->done_, cudaEventDisableTiming); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaEventCreate: ", CudaError(e)));
  }
  const size_t scratch_bytes = static_cast<size_t>(storage_->geometry().elements_per_block()) * sizeof(float);
  if (cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&link->scratch_), scratch_bytes, link->stream_);
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

}  // namespace tandem
