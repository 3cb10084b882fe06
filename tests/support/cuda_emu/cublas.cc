// The CUDA emulator's cuBLAS: the handle, its stream and the GEMMs this project calls.
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "tests/support/cuda_emu/cuda_emu.h"
#include "tests/support/cuda_emu/runtime_internal.h"

using tandem_emu::Enqueue;

// --- cuBLAS: column-major GEMMs over f32 (16-bit inputs widened exactly) ---
// Each output is its own dot product in one fixed order (eight interleaved partial sums, then their
// sum), so a row's result never depends on the rows beside it or its place among them, as with
// cuBLAS on a fixed shape (the batch-invariant mode relies on it). OpenBLAS is not used: some of
// its kernels (Haswell's) round an output differently by its column's place in the tile.

namespace {

float Element(const void* p, cudaDataType type, int64_t i) {
  switch (type) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
    default: std::abort();
  }
}

// op(X)'s `vectors` vectors of `k` elements each, contiguous in f32: for A (m × k) its rows, for B
// (k × n) its columns. X is column-major with leading dimension ld; `by_column`: vector v is X's
// column v (else its row v).
std::vector<float> Vectors(const void* x, cudaDataType type, int64_t ld, int64_t vectors, int64_t k,
                           bool by_column) {
  std::vector<float> out(vectors * k);
  for (int64_t v = 0; v < vectors; ++v) {
    for (int64_t p = 0; p < k; ++p)
      out[v * k + p] = Element(x, type, by_column ? v * ld + p : p * ld + v);
  }
  return out;
}

float Dot(const float* a, const float* b, int64_t k) {
  float lanes[8] = {};
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[p + l] * b[p + l];
  }
  for (; p < k; ++p) lanes[p % 8] += a[p] * b[p];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

bool Supported(cudaDataType type) {
  return type == CUDA_R_32F || type == CUDA_R_16BF || type == CUDA_R_16F;
}

// C[m][n] (column-major, ldc) = alpha · op(A) · op(B) + beta · C.
cublasStatus_t Gemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                    int k, float alpha, const void* a, cudaDataType at, int lda, const void* b,
                    cudaDataType bt, int ldb, float beta, void* c, cudaDataType ct, int ldc) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || !Supported(at) || !Supported(bt) || ct != CUDA_R_32F)
    return CUBLAS_STATUS_INVALID_VALUE;
  if ((ta == CUBLAS_OP_N ? lda < std::max(1, m) : lda < std::max(1, k)) ||
      (tb == CUBLAS_OP_N ? ldb < std::max(1, k) : ldb < std::max(1, n)) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  tandem_emu::NoteHostCall(tandem_emu::HostCall::kLaunch, "cublasGemmEx");
  const cudaError_t e = Enqueue(handle->stream, [=] {
    // A's rows: with op T, A's stored columns; B's columns: with op N, its stored columns.
    const std::vector<float> rows = Vectors(a, at, lda, m, k, ta != CUBLAS_OP_N);
    const std::vector<float> cols = Vectors(b, bt, ldb, n, k, tb == CUBLAS_OP_N);
    float* out = static_cast<float*>(c);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        const float s = alpha * Dot(rows.data() + i * k, cols.data() + j * k, k);
        float& r = out[j * ldc + i];
        r = beta == 0.f ? s
                        : s + beta * r;  // cuBLAS does not read C when beta is 0 (it may hold NaN)
      }
    }
    return cudaSuccess;
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                              int m, int n, int k, const float* alpha, const float* a, int lda,
                              const float* b, int ldb, const float* beta, float* c, int ldc) {
  return Gemm(handle, ta, tb, m, n, k, *alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, *beta, c,
              CUDA_R_32F, ldc);
}
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void* alpha, const void* a, cudaDataType at,
                            int lda, const void* b, cudaDataType bt, int ldb, const void* beta,
                            void* c, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return Gemm(handle, ta, tb, m, n, k, *static_cast<const float*>(alpha), a, at, lda, b, bt, ldb,
              *static_cast<const float*>(beta), c, ct, ldc);
}

}  // extern "C"
