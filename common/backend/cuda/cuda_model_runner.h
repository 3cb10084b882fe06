// The CUDA backend's model runner: the generic runner's step (metadata, scratch, decode graphs,
// device sampling) with the layer run on CudaBackend's fused kernels: q|k|v projection, split,
// q/k norms, RoPE and cache write in one prologue (QkvAttention); residual adds and norms inside
// the projections' GEMV where it takes them (RmsNormLinear, LinearResidual); silu · up as the
// gate|up GEMV writes (LinearSiluMul). Each fusion falls back to its composition
// (composed_ops.h) where its kernel does not cover a shape, so the results equal the generic
// runner's on the same backend.
#pragma once

#include <functional>

#include "common/backend/cuda/cuda_backend.h"
#include "common/backend/model_runner.h"

namespace tandem {

class CudaModelRunner final : public ModelRunner {
 public:
  CudaModelRunner(CudaBackend* backend, TransformerWeights weights);

 protected:
  void Enqueue(const StepBuffers& buf, KvCacheStorage* kv,
               const std::function<void(int64_t)>& on_layer_done, bool argmax) override;

 private:
  CudaBackend* cuda_;
};

}  // namespace tandem
