#include "cli/calibration.h"

namespace tandem::cli {

CalibrationBackend::CalibrationBackend(std::unique_ptr<Backend> inner,
                                       const std::vector<std::vector<std::string>>& inputs,
                                       const std::vector<int64_t>& in_features)
    : BackendWrapper(std::move(inner)), in_features_(in_features), hessians_(inputs.size()) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (const std::string& name : inputs[i]) group_of_name_[name] = static_cast<int>(i);
  }
}

absl::StatusOr<DeviceWeight> CalibrationBackend::UploadWeight(const TensorView& t) {
  absl::StatusOr<DeviceWeight> w = inner()->UploadWeight(t);
  const auto it = group_of_name_.find(t.name);
  if (w.ok() && it != group_of_name_.end()) group_of_data_[w->data] = it->second;
  return w;
}

void CalibrationBackend::Watch(const std::vector<int>& groups) {
  for (auto& h : hessians_) h.reset();
  for (int g : groups) hessians_[g] = std::make_unique<HessianAccumulator>(in_features_[g]);
  last_group_ = -1;
}

int64_t CalibrationBackend::hessian_bytes(int group) const {
  return in_features_[group] * in_features_[group] * static_cast<int64_t>(sizeof(float));
}

void CalibrationBackend::Linear(const float* x, int64_t n, const DeviceWeight& w,
                                const DeviceWeight* bias, float* out) {
  inner()->Linear(x, n, w, bias, out);
  const auto it = group_of_data_.find(w.data);
  if (it == group_of_data_.end()) return;
  const int g = it->second;
  // k or v after q (up after gate): the same rows, counted once. Every projection's call moves
  // the mark, watched or not, so the next chunk's q of a layer is never taken for its k.
  const bool seen = g == last_group_ && x == last_x_ && n == last_n_;
  last_group_ = g;
  last_x_ = x;
  last_n_ = n;
  if (seen || hessians_[g] == nullptr) return;
  HessianAccumulator& h = *hessians_[g];
  const float* rows = x;
  if (!inner()->host_memory()) {
    host_.resize(static_cast<size_t>(n * h.cols()));
    inner()->CopyToHost(host_.data(), x, host_.size() * sizeof(float));
    rows = host_.data();
  }
  h.Add(rows, n);
}

}  // namespace tandem::cli
