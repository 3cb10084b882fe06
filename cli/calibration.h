// GPTQ's calibration (`tandem quantize --method gptq`): the model runs over calibration text as
// stored, on a backend that watches projections' inputs and accumulates their Hessians (Xᵀ X,
// gptq.h), from the unquantized model's activations (not from already quantized layers, as the
// GPTQ paper's implementation does it layer by layer). The projections of one input share a
// Hessian (q/k/v one, gate/up another). Which inputs are watched is chosen per pass, so that a
// model whose Hessians do not fit in memory at once is calibrated in several passes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/backend/backend_wrapper.h"
#include "common/quant/gptq.h"

namespace tandem::cli {

class CalibrationBackend final : public BackendWrapper {
 public:
  // `inputs`: the weights' names, grouped by the input they multiply; in_features of each group.
  CalibrationBackend(std::unique_ptr<Backend> inner,
                     const std::vector<std::vector<std::string>>& inputs,
                     const std::vector<int64_t>& in_features);

  absl::StatusOr<DeviceWeight> UploadWeight(const TensorView& t) override;
  void Linear(const float* x, int64_t n, const DeviceWeight& w, const DeviceWeight* bias,
              float* out) override;

  // Accumulates the Hessians of `groups` from now on (zeroed), and frees the others'.
  void Watch(const std::vector<int>& groups);
  // The Hessian of a watched input group.
  const HessianAccumulator& hessian(int group) const { return *hessians_[group]; }
  // Bytes group `g`'s Hessian takes.
  int64_t hessian_bytes(int group) const;

 private:
  std::vector<int64_t> in_features_;
  std::map<std::string, int> group_of_name_;
  std::map<const void*, int> group_of_data_;  // uploaded weights' data → input group
  std::vector<std::unique_ptr<HessianAccumulator>> hessians_;  // null: not watched
  // The last input accumulated: projections of one input run one after another on one buffer.
  int last_group_ = -1;
  const float* last_x_ = nullptr;
  int64_t last_n_ = 0;
  std::vector<float> host_;  // x copied to the host, for a backend whose memory is not the host's
};

}  // namespace tandem::cli
