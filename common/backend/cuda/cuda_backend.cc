// The CUDA backend's resources: creation and its tunings, the sticky error, device memory (buffers,
// scratch, the KV copy staging), weights, host copies and block gathers, marks, and graph capture.
// The ops it enqueues are in cuda_ops.cc.
#include "common/backend/cuda/cuda_backend.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/backend/cuda/gemv.h"
#include "common/backend/cuda/kernels.h"
#include "common/backend/cuda/quant_gemv.h"
#include "common/backend/cuda/smoke_kernel.h"
#include "common/base/status_macros.h"
#include "common/tensor/dtype.h"

namespace tandem {
namespace {

using LiveBytes = std::shared_ptr<std::atomic<int64_t>>;

// Whether environment variable `name` is "1" (the backend's opt-in switches).
bool EnvIsOne(const char* name) {
  const char* p = std::getenv(name);
  return p != nullptr && std::string(p) == "1";
}

// Environment variable `name` as one of `choices` into *value (unset: *value stays, the default);
// INVALID_ARGUMENT naming the variable and its choices for anything else (the backend's tunings).
absl::Status EnvChoice(const char* name, std::span<const int> choices, int* value) {
  const char* p = std::getenv(name);
  if (p == nullptr) return absl::OkStatus();
  for (int c : choices) {
    if (std::to_string(c) == p) {
      *value = c;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be ", ChoicesText(choices), ", not '", p, "'"));
}

// Memory from the backend's stream's pool (cudaMallocAsync), given back in that stream's order: a
// plain cudaFree would wait for the whole device, a transfer stream's NCCL receive from a stalled
// peer included. The buffer keeps the stream alive until its free is enqueued.
class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(void* data, size_t bytes, LiveBytes live, std::shared_ptr<CUstream_st> stream)
      : data_(data), bytes_(bytes), live_(std::move(live)), stream_(std::move(stream)) {
    *live_ += static_cast<int64_t>(bytes_);
  }
  ~CudaBuffer() override {
    cudaFreeAsync(data_, stream_.get());
    *live_ -= static_cast<int64_t>(bytes_);
  }
  void* data() override { return data_; }
  size_t size() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
  LiveBytes live_;
  std::shared_ptr<CUstream_st> stream_;
};

absl::Status CudaStatus(cudaError_t e, const char* what) {
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

// An event recorded on the backend's stream, polled (so that a hung device ends the wait at its
// deadline instead of holding the thread), destroyed with the mark.
class CudaWorkMark final : public WorkMark {
 public:
  CudaWorkMark(int device, cudaEvent_t event) : device_(device), event_(event) {}
  ~CudaWorkMark() override { cudaEventDestroy(event_); }
  absl::Status Wait(absl::Time deadline) override {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
      return CudaStatus(e, "cudaSetDevice");
    for (absl::Duration pause = absl::Microseconds(20);;
         pause = std::min(pause * 2, absl::Microseconds(500))) {
      const cudaError_t e = cudaEventQuery(event_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return CudaStatus(e, "waiting for the work before a mark");
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            "the device did not finish the work before a mark in time");
      }
      absl::SleepFor(pause);
    }
  }

 private:
  int device_;
  cudaEvent_t event_;
};

// Device memory freed when the last DeviceWeight copy referring to it goes.
absl::StatusOr<std::shared_ptr<void>> UploadBytes(const void* src, size_t bytes,
                                                  cudaStream_t stream, const LiveBytes& live) {
  void* dev = nullptr;
  const size_t held = std::max<size_t>(bytes, 1);
  if (cudaError_t e = cudaMalloc(&dev, held); e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes, " bytes of GPU memory for a weight: ", cudaGetErrorString(e)));
  }
  *live += static_cast<int64_t>(held);
  std::shared_ptr<void> owner(dev, [live, held](void* p) {
    cudaFree(p);
    *live -= static_cast<int64_t>(held);
  });
  if (cudaError_t e = cudaMemcpyAsync(dev, src, bytes, cudaMemcpyHostToDevice, stream);
      e != cudaSuccess) {
    return CudaStatus(e, "uploading a weight");
  }
  return owner;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const Options& options) {
  if (options.compute_dtype.has_value() && *options.compute_dtype != DType::kBF16 &&
      *options.compute_dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA backend's compute type is BF16 or F16, not ",
                     std::string(DTypeName(*options.compute_dtype))));
  }
  const int count = cuda::DeviceCount();
  if (count == 0)
    return absl::FailedPreconditionError(
        "--device cuda: no CUDA device is visible (no driver or no GPU)");
  if (options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", count, " visible)"));
  }
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess)
    return CudaStatus(e, "cudaSetDevice");
  auto description = cuda::DeviceDescription(options.device);
  if (!description.ok()) return description.status();
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaStatus(e, "cudaStreamCreate");
  }
  cublasHandle_t cublas = nullptr;
  if (cublasStatus_t s = cublasCreate(&cublas); s != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return absl::InternalError(absl::StrCat("cublasCreate: ", cublasGetStatusString(s)));
  }
  // The default math mode keeps SGEMM in exact FP32 (no TF32) and lets 16-bit GEMMs use the tensor
  // cores.
  if (cublasStatus_t s = cublasSetStream(cublas, stream); s != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(cublas);
    cudaStreamDestroy(stream);
    return absl::InternalError(absl::StrCat("cublasSetStream: ", cublasGetStatusString(s)));
  }
  auto backend = std::unique_ptr<CudaBackend>(new CudaBackend(
      options.device, options.batch_invariant,
      absl::StrCat("cuda:", options.device, " ", *description,
                   options.batch_invariant ? ", batch-invariant Linear" : ""),
      std::shared_ptr<CUstream_st>(stream, [](cudaStream_t s) { cudaStreamDestroy(s); }), cublas));
  backend->compute_dtype_ = options.compute_dtype;
  backend->split_gemm_inputs_ = options.split_gemm_inputs;
  // cuBLAS's workspace, fixed up front: a GEMM inside a graph capture must not allocate.
  constexpr size_t kCublasWorkspace = 32 << 20;
  if (cudaError_t e = cudaMalloc(&backend->cublas_workspace_, kCublasWorkspace); e != cudaSuccess) {
    return CudaStatus(e, "allocating the cuBLAS workspace");
  }
  *backend->live_bytes_ += kCublasWorkspace;
  if (cublasStatus_t s = cublasSetWorkspace(cublas, backend->cublas_workspace_, kCublasWorkspace);
      s != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cublasSetWorkspace: ", cublasGetStatusString(s)));
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&backend->copy_stream_, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return CudaStatus(e, "cudaStreamCreate (copies)");
  }
  if (cudaError_t e = cudaEventCreateWithFlags(&backend->copy_after_, cudaEventDisableTiming);
      e != cudaSuccess) {
    return CudaStatus(e, "cudaEventCreate (copies)");
  }
  // The tunings (cuda_tunings.h): the options', each overridden by its environment variable when
  // that is set (benchmarks compare settings that way).
  CudaTunings t = options.tunings;
  RETURN_IF_ERROR(ValidateCudaTunings(t));
  RETURN_IF_ERROR(EnvChoice("TANDEM_CUDA_GEMV_COLUMNS", kCudaGemvColumns, &t.gemv_columns));
  RETURN_IF_ERROR(EnvChoice("TANDEM_CUDA_GRID_SPLIT_KEYS", kCudaGridSplitKeys, &t.grid_split_keys));
  for (auto [name, value] : {std::pair<const char*, bool*>{"TANDEM_CUDA_FUSION", &t.fusion},
                             {"TANDEM_CUDA_GEMV_NORM", &t.gemv_norm},
                             {"TANDEM_CUDA_GEMV_HEADS", &t.gemv_heads}}) {
    constexpr int kOffOn[] = {0, 1};
    int on = *value;
    RETURN_IF_ERROR(EnvChoice(name, kOffOn, &on));
    *value = on == 1;
  }
  if (EnvIsOne("TANDEM_CUDA_TC_ATTENTION")) t.tensor_core_attention = true;
  if (EnvIsOne("TANDEM_CUDA_PDL")) t.programmatic_launch = true;
  if (EnvIsOne("TANDEM_CUDA_OP_PROFILE")) t.op_profile = true;
  backend->tunings_ = t;
  if (t.programmatic_launch) cuda::RequestProgrammaticLaunch();
  if (t.op_profile) backend->SetOpProfiling(true);
  // The q|k|v GEMV's per-head counters (GemvEpilogue::head_counters), zero, fixed up front
  // (graphs).
  if (cudaError_t e = cudaMalloc(&backend->head_counters_, kHeadCounters * sizeof(unsigned));
      e != cudaSuccess) {
    return CudaStatus(e, "allocating the q|k|v GEMV's counters");
  }
  *backend->live_bytes_ += kHeadCounters * sizeof(unsigned);
  if (cudaError_t e =
          cudaMemsetAsync(backend->head_counters_, 0, kHeadCounters * sizeof(unsigned), stream);
      e != cudaSuccess) {
    return CudaStatus(e, "zeroing the q|k|v GEMV's counters");
  }
  // The tunings off their defaults, in the description (workers log it, forward_bench records it).
  std::vector<std::string> tunings;
  if (!t.fusion) tunings.push_back("fusion off");
  if (t.fusion && !t.gemv_norm) tunings.push_back("GEMV norm off");
  if (t.fusion && !t.gemv_heads) tunings.push_back("GEMV heads off");
  if (t.gemv_columns != 1) tunings.push_back(absl::StrCat("GEMV columns ", t.gemv_columns));
  if (t.grid_split_keys != 256 && !backend->batch_invariant_) {
    tunings.push_back(absl::StrCat("grid splits of ", t.grid_split_keys, " keys"));
  }
  if (cuda::ProgrammaticLaunchOn()) tunings.push_back("programmatic dependent launch");
  if (t.tensor_core_attention) tunings.push_back("tensor-core prompt attention");
  if (options.compute_dtype.has_value()) {
    tunings.push_back(absl::StrCat("16-bit weights and GEMMs in ",
                                   std::string(DTypeName(*options.compute_dtype))));
  }
  if (options.split_gemm_inputs) tunings.push_back("GEMM inputs split into two 16-bit terms");
  if (!tunings.empty()) backend->description_ += absl::StrCat(", ", absl::StrJoin(tunings, ", "));
  return backend;
}

CudaBackend::~CudaBackend() {
  Bind();
  cudaStreamSynchronize(stream_);
  DropGraphs();
  for (void* p : scratch_) {
    if (p != nullptr) cudaFreeAsync(p, stream_);  // (not documented to take null, unlike cudaFree)
  }
  cublasDestroy(cublas_);
  cudaFree(cublas_workspace_);
  cudaFree(head_counters_);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  if (copy_staging_ != nullptr) cudaFreeAsync(copy_staging_, copy_stream_);
  if (copy_after_ != nullptr) cudaEventDestroy(copy_after_);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  // (the compute stream goes with the last buffer allocated on it: stream_owner_)
}

void CudaBackend::Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = CudaStatus(e, what);
}

void CudaBackend::Check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusString(s)));
}

absl::Status CudaBackend::CheckErrors() {
  Bind();
  Check(cudaStreamSynchronize(stream_), "synchronising the stream");
  if (profiler_) profiler_->Collect();
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void CudaBackend::SetOpProfiling(bool on) {
  if (!on) {
    profiler_.reset();
  } else if (!profiler_) {
    profiler_ = std::make_unique<cuda::OpProfiler>();
  }
}

std::string CudaBackend::OpProfileReport() {
  if (!profiler_) return "";
  Bind();
  Check(cudaStreamSynchronize(stream_), "synchronising the stream");
  profiler_->Collect();
  std::string report = profiler_->Report();
  profiler_->Reset();
  return report;
}

absl::StatusOr<DeviceMemory> CudaBackend::Memory() {
  Bind();
  // Memory freed in this stream's order (scratch, buffers) is the pool's until its frees have run
  // and the pool has given it back: then it counts as free.
  Check(cudaStreamSynchronize(stream_), "synchronising the stream");
  cudaMemPool_t pool = nullptr;
  if (cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, device_); e != cudaSuccess) {
    return CudaStatus(e, "cudaDeviceGetDefaultMemPool");
  }
  if (cudaError_t e = cudaMemPoolTrimTo(pool, 0); e != cudaSuccess)
    return CudaStatus(e, "cudaMemPoolTrimTo");
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess)
    return CudaStatus(e, "cudaMemGetInfo");
  return DeviceMemory{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes),
                      live_bytes_->load()};
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaBackend::Allocate(size_t bytes) {
  Bind();
  void* dev = nullptr;
  bytes = std::max<size_t>(bytes, 256);
  // (Inside a capture the allocation would become the graph's own, and the wait below would end
  // it.)
  if (capturing_)
    return absl::FailedPreconditionError("allocating GPU memory while capturing a graph");
  if (cudaError_t e = cudaMallocAsync(&dev, bytes, stream_); e != cudaSuccess) {
    cudaGetLastError();  // out-of-memory is not sticky; clear it
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of GPU memory: ", cudaGetErrorString(e)));
  }
  auto buffer =
      std::unique_ptr<DeviceBuffer>(new CudaBuffer(dev, bytes, live_bytes_, stream_owner_));
  // Zeroed, like fresh host pages: unused KV slots and padding never hold NaN bit patterns. Both
  // the allocation and the zeroing are in this stream's order: work on other streams must wait for
  // them (KvCacheStorage::Create does, before KV copies and transfers touch the cache).
  Check(cudaMemsetAsync(dev, 0, bytes, stream_), "cudaMemset");
  return buffer;
}

void CudaBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  Bind();
  std::lock_guard<std::mutex> no_capture(capture_mu_);
  if (bytes == 0) return;
  // Callers may free `src` on return, and an asynchronous copy from pageable memory is not promised
  // to have read it by then: wait. (Forward ends each step with CheckErrors, so the stream is idle
  // when a step's inputs are copied; the wait costs the copy itself.)
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
  Check(cudaStreamSynchronize(stream_), "copy to device");
}

std::shared_ptr<WorkMark> CudaBackend::Mark() {
  if (capturing_) return nullptr;  // (the capturing thread's own call: a graph has no marks)
  Bind();
  cudaEvent_t event = nullptr;
  if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); e != cudaSuccess) {
    Check(e, "creating a work mark");
    return nullptr;
  }
  if (cudaError_t e = cudaEventRecord(event, stream_); e != cudaSuccess) {
    cudaEventDestroy(event);
    Check(e, "recording a work mark");
    return nullptr;
  }
  return std::make_shared<CudaWorkMark>(device_, event);
}

CudaBackend::CopyStaging CudaBackend::StageCopy(const std::vector<int32_t>& index, size_t total) {
  // The index first, 16-byte aligned, then the pieces.
  const size_t n = index.size(), want = (n * sizeof(int32_t) + 15) / 16 * 16 + total;
  if (want > copy_staging_bytes_) {
    if (copy_staging_ != nullptr) {
      cudaFreeAsync(copy_staging_, copy_stream_);  // (its only stream)
      *live_bytes_ -= static_cast<int64_t>(copy_staging_bytes_);
      copy_staging_ = nullptr;
      copy_staging_bytes_ = 0;
    }
    if (cudaError_t e = cudaMallocAsync(&copy_staging_, want, copy_stream_); e != cudaSuccess) {
      copy_staging_ = nullptr;
      Check(e, "allocating KV copy staging");
      return {};
    }
    copy_staging_bytes_ = want;
    *live_bytes_ += static_cast<int64_t>(want);
  }
  CopyStaging s{static_cast<int32_t*>(copy_staging_),
                reinterpret_cast<float*>(static_cast<std::byte*>(copy_staging_) +
                                         copy_staging_bytes_ - total)};
  Check(cudaMemcpyAsync(s.index, index.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice,
                        copy_stream_),
        "KV copy index");
  return s;
}

void CudaBackend::GatherToHost(const std::byte* src, const std::vector<int32_t>& index,
                               size_t bytes, void* host_out, bool after_enqueued_work) {
  if (index.empty() || bytes == 0) return;
  if (bytes % sizeof(float) != 0)
    return Backend::GatherToHost(src, index, bytes, host_out, after_enqueued_work);
  Bind();
  std::lock_guard<std::mutex> lock(copy_mu_);
  const size_t n = index.size(), total = n * bytes;
  if (after_enqueued_work) {  // the copy stream waits on the device, not this thread
    std::lock_guard<std::mutex> no_capture(capture_mu_);
    Check(cudaEventRecord(copy_after_, stream_), "ordering a gather after the ops");
    Check(cudaStreamWaitEvent(copy_stream_, copy_after_, 0), "ordering a gather after the ops");
  }
  const CopyStaging s = StageCopy(index, total);
  if (s.pieces == nullptr) return;
  Check(
      cuda::LaunchGatherRows(reinterpret_cast<const float*>(src), s.index, static_cast<int64_t>(n),
                             static_cast<int64_t>(bytes / sizeof(float)), s.pieces, copy_stream_),
      "gathering blocks");
  Check(cudaMemcpyAsync(host_out, s.pieces, total, cudaMemcpyDeviceToHost, copy_stream_),
        "gathered blocks to host");
  Check(cudaStreamSynchronize(copy_stream_), "gathered blocks to host");
}

void CudaBackend::ScatterFromHost(std::byte* dst, const std::vector<int32_t>& index, size_t bytes,
                                  const void* host_in) {
  if (index.empty() || bytes == 0) return;
  if (bytes % sizeof(float) != 0) return Backend::ScatterFromHost(dst, index, bytes, host_in);
  Bind();
  std::lock_guard<std::mutex> lock(copy_mu_);
  const size_t n = index.size(), total = n * bytes;
  const CopyStaging s = StageCopy(index, total);
  if (s.pieces == nullptr) return;
  Check(cudaMemcpyAsync(s.pieces, host_in, total, cudaMemcpyHostToDevice, copy_stream_),
        "blocks to device");
  Check(cuda::LaunchScatterBlocks(s.pieces, s.index, static_cast<int64_t>(n),
                                  static_cast<int64_t>(bytes / sizeof(float)),
                                  reinterpret_cast<float*>(dst), copy_stream_),
        "scattering blocks");
  Check(cudaStreamSynchronize(copy_stream_), "blocks to device");
}

void CudaBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  Bind();
  std::lock_guard<std::mutex> no_capture(capture_mu_);
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
  Check(cudaStreamSynchronize(stream_), "copy to host");
}

DType CudaBackend::StoredWeightDType(DType checkpoint) const {
  const bool half = checkpoint == DType::kBF16 || checkpoint == DType::kF16;
  return half && compute_dtype_.has_value() ? *compute_dtype_ : checkpoint;
}

namespace {

// BF16 → F16, 8 values a step with F16C (the hardware's round to nearest even, subnormals included:
// F32ToF16's results without its branches, which a model of billions of weights notices at load).
// Returns how many values it converted: it stops before the last n % 8 and before the first group
// of 8 holding a value not within ±65504 (infinities and NaN included), which the exact pass below
// takes.
__attribute__((target("avx2,f16c"))) size_t Bf16ToF16Vector(const uint16_t* in, size_t n,
                                                            uint16_t* out) {
  const __m256 limit = _mm256_set1_ps(65504.f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))), 16));
    if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, abs_mask), limit, _CMP_NLE_UQ)) != 0)
      break;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}

// `t`'s 16-bit values in the other 16-bit type `to`, into `out` [t.nbytes / 2]. F16 holds every
// BF16 value of magnitude 2^-14..65504 exactly (smaller ones round to its subnormals); a value
// beyond 65504 is refused, naming the tensor.
absl::Status CastHalfWeight(const TensorView& t, DType to, uint16_t* out) {
  const auto* in = reinterpret_cast<const uint16_t*>(t.data);
  const size_t n = t.nbytes / 2;
  static const bool f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  const size_t vectored =
      f16c && t.dtype == DType::kBF16 && to == DType::kF16 ? Bf16ToF16Vector(in, n, out) : 0;
  for (size_t i = vectored; i < n; ++i) {
    const float f = t.dtype == DType::kBF16 ? Bf16ToF32(in[i]) : F16ToF32(in[i]);
    if (to == DType::kF16 && std::isfinite(f) && std::fabs(f) > 65504.f) {
      return absl::InvalidArgumentError(
          absl::StrCat(t.file, ": tensor ", t.name, " holds ", f,
                       ", beyond F16's range (65504): it cannot run with "
                       "--compute-dtype=f16; use auto or bf16"));
    }
    out[i] = to == DType::kF16 ? F32ToF16(f) : F32ToBf16(f);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceWeight> CudaBackend::UploadQuantizedWeight(
    std::shared_ptr<const QuantizedMatrix> matrix) {
  const QuantizedMatrix& m = *matrix;
  RETURN_IF_ERROR(Validate(m, "quantized weight"));
  if (!cuda::QuantLayoutCovered(m.type, m.cols, m.group_size)) {
    return Backend::UploadQuantizedWeight(std::move(matrix));  // dequantized
  }
  Bind();
  // The codes, scales, zero points and column order, each its own device buffer, held together.
  struct Buffers {
    std::shared_ptr<void> codes, scales, zeros, perm;
  };
  auto held = std::make_shared<Buffers>();
  ASSIGN_OR_RETURN(held->codes, UploadBytes(m.codes.data(), m.codes.size(), stream_, live_bytes_));
  ASSIGN_OR_RETURN(held->scales, UploadBytes(m.scales.data(), m.scales.size() * sizeof(float),
                                             stream_, live_bytes_));
  if (!m.zeros.empty()) {
    ASSIGN_OR_RETURN(held->zeros, UploadBytes(m.zeros.data(), m.zeros.size() * sizeof(float),
                                              stream_, live_bytes_));
  }
  if (!m.perm.empty()) {
    ASSIGN_OR_RETURN(held->perm, UploadBytes(m.perm.data(), m.perm.size() * sizeof(int32_t),
                                             stream_, live_bytes_));
  }
  if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess)
    return CudaStatus(e, "uploading a quantized weight");
  DeviceWeight w;
  w.dtype = DType::kI8;  // no 16-bit kernel takes it for its own (the fused GEMVs decline)
  w.rows = m.rows;
  w.cols = m.cols;
  w.quant = m.type;
  w.group_size = m.group_size;
  w.data = held->codes.get();
  w.scales = static_cast<const float*>(held->scales.get());
  w.zeros = static_cast<const float*>(held->zeros.get());
  w.perm = static_cast<const int32_t*>(held->perm.get());
  w.owner = std::move(held);
  // Scratch a step will need, grown now rather than inside a graph capture: larger steps'
  // dequantized weight, and a decode step's gathered input.
  Scratch(kDequantizedWeight, static_cast<size_t>(m.rows * m.cols) * 2, /*optional=*/true);
  if (!m.perm.empty()) {
    Scratch(kPermutedInput, static_cast<size_t>(cuda::kGemvMaxRows * m.cols) * sizeof(float),
            /*optional=*/true);
  }
  return w;
}

absl::StatusOr<DeviceWeight> CudaBackend::UploadWeight(const TensorView& t) {
  Bind();
  DeviceWeight w;
  std::vector<float> host;     // outlives the copy (synchronised below)
  std::vector<uint16_t> cast;  // the same, for a 16-bit tensor cast to the compute type
  if (t.shape.size() == 1) {
    w.rows = 1;
    w.cols = t.shape[0];
    w.dtype = DType::kF32;
    host.resize(static_cast<size_t>(std::max<int64_t>(w.cols, 1)));
    ConvertToF32(t.dtype, t.data, host.data(), static_cast<size_t>(w.cols));
    auto owner =
        UploadBytes(host.data(), static_cast<size_t>(w.cols) * sizeof(float), stream_, live_bytes_);
    if (!owner.ok()) return owner.status();
    w.owner = *std::move(owner);
  } else if (t.shape.size() == 2) {
    w.dtype = StoredWeightDType(t.dtype);
    if (w.dtype == DType::kBF16 || w.dtype == DType::kF16) {
      gemm_dtype_mixed_ |= gemm_dtype_ != DType::kF32 && gemm_dtype_ != w.dtype;
      gemm_dtype_ = w.dtype;
    }
    w.rows = t.shape[0];
    w.cols = t.shape[1];
    const void* src = t.data;
    if (w.dtype != t.dtype) {
      cast.resize(t.nbytes / 2);
      RETURN_IF_ERROR(CastHalfWeight(t, w.dtype, cast.data()));
      src = cast.data();
    }
    auto owner = UploadBytes(src, t.nbytes, stream_, live_bytes_);
    if (!owner.ok()) return owner.status();
    w.owner = *std::move(owner);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(t.file, ": tensor ", t.name, " has rank ",
                                                   t.shape.size(), ", expected 1 or 2"));
  }
  w.data = w.owner.get();
  // The host source (the vector, or a mapping the caller may unmap) must outlive the copy.
  if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess)
    return CudaStatus(e, "uploading a weight");
  return w;
}

absl::Status CudaBackend::BeginCapture() {
  Bind();
  RETURN_IF_ERROR(CheckErrors());
  if (capturing_) return absl::FailedPreconditionError("already capturing");
  // Other threads copy on this stream (a KV transfer's staged layers): they wait while it is
  // captured.
  capture_lock_ = std::unique_lock<std::mutex>(capture_mu_);
  if (cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
      e != cudaSuccess) {
    cudaGetLastError();  // a failed capture must not fail the next launch
    capture_lock_.unlock();
    return CudaStatus(e, "cudaStreamBeginCapture");
  }
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaBackend::EndCapture() {
  Bind();
  if (!capturing_) return absl::FailedPreconditionError("not capturing");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
  capture_lock_.unlock();
  absl::Status failed = e != cudaSuccess ? CudaStatus(e, "cudaStreamEndCapture") : absl::OkStatus();
  if (failed.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    failed = error_;  // an op refused during the capture
  }
  cudaGraphExec_t exec = nullptr;
  if (failed.ok()) {
    if (cudaError_t i = cudaGraphInstantiate(&exec, graph, 0); i != cudaSuccess)
      failed = CudaStatus(i, "cudaGraphInstantiate");
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!failed.ok()) {
    // Nothing captured ever ran, the backend was sound when the capture began (BeginCapture
    // checked), and no other thread used it meanwhile (copies wait for captures): forget what the
    // capture recorded, so the failure costs graphs, not the backend.
    cudaGetLastError();
    std::lock_guard<std::mutex> lock(mu_);
    error_ = absl::OkStatus();
    return failed;
  }
  graphs_.push_back(exec);
  return static_cast<int64_t>(graphs_.size()) - 1;
}

absl::Status CudaBackend::Replay(int64_t id) {
  Bind();
  if (id < 0 || id >= static_cast<int64_t>(graphs_.size()) || graphs_[id] == nullptr) {
    return absl::NotFoundError("no such graph (dropped when scratch memory grew)");
  }
  Check(cudaGraphLaunch(graphs_[id], stream_), "cudaGraphLaunch");
  return absl::OkStatus();
}

void CudaBackend::DropGraphs() {
  for (cudaGraphExec_t& g : graphs_) {
    if (g != nullptr) cudaGraphExecDestroy(g);
    g = nullptr;
  }
}

void* CudaBackend::Scratch(ScratchSlot slot, size_t bytes, bool optional) {
  if (bytes <= scratch_bytes_[slot]) return scratch_[slot];
  if (capturing_) {  // allocation would break the capture: the caller should have run the work
                     // before
    if (!optional)
      Check(cudaErrorStreamCaptureUnsupported, "growing scratch memory while capturing a graph");
    return nullptr;
  }
  // An optional buffer that could not be had at this size is not tried again (each try would cost
  // the graphs below and a failed cudaMalloc).
  if (optional && scratch_refused_[slot] != 0 && bytes >= scratch_refused_[slot]) return nullptr;
  if (scratch_[slot]) {
    DropGraphs();  // they point at the memory about to be freed
    // In stream order: after the work already enqueued, without waiting for it (or, as cudaFree
    // would, for every other stream of the device). Scratch is used on this stream alone.
    cudaFreeAsync(scratch_[slot], stream_);
    *live_bytes_ -= static_cast<int64_t>(scratch_bytes_[slot]);
  }
  scratch_[slot] = nullptr;
  scratch_bytes_[slot] = 0;
  const size_t want = bytes + bytes / 4;
  if (cudaError_t e = cudaMallocAsync(&scratch_[slot], want, stream_); e != cudaSuccess) {
    cudaGetLastError();  // not sticky: keep it from being reported again by the next launch
    scratch_[slot] = nullptr;
    if (optional) {
      scratch_refused_[slot] = bytes;
    } else {
      Check(e, "allocating scratch memory");
    }
    return nullptr;
  }
  // Zeroed: the attention's split counters (in kAttentionPartials) must start at zero.
  Check(cudaMemsetAsync(scratch_[slot], 0, want, stream_), "zeroing scratch memory");
  scratch_bytes_[slot] = want;
  *live_bytes_ += static_cast<int64_t>(want);
  return scratch_[slot];
}

}  // namespace tandem
