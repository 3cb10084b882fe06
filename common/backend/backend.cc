#include "common/backend/backend.h"

namespace tandem {

int64_t DeviceWeight::bytes() const {
  if (quant == QuantType::kNone) return rows * cols * static_cast<int64_t>(DTypeSize(dtype));
  const int64_t groups = group_size > 0 ? (cols + group_size - 1) / group_size : 0;
  const int64_t codes = quant == QuantType::kInt4 ? rows * cols / 2 : rows * cols;
  return codes + rows * groups * static_cast<int64_t>(sizeof(float)) * (zeros ? 2 : 1) +
         (perm ? cols * static_cast<int64_t>(sizeof(int32_t)) : 0);
}

void Backend::LinearEach(const float* x, int64_t n, absl::Span<const Projection> projections) {
  for (const Projection& p : projections) Linear(x, n, *p.w, p.bias, p.out);
}

absl::StatusOr<DeviceWeight> Backend::UploadQuantizedWeight(
    std::shared_ptr<const QuantizedMatrix> matrix) {
  auto values = std::make_shared<std::vector<float>>(Dequantize(*matrix));
  const DType dtype = DequantizedWeightDType();
  TensorView t;
  t.name = "dequantized";
  t.dtype = dtype;
  t.shape = {matrix->rows, matrix->cols};
  std::shared_ptr<void> bytes = values;
  if (dtype == DType::kBF16 || dtype == DType::kF16) {
    auto half = std::make_shared<std::vector<uint16_t>>(values->size());
    for (size_t i = 0; i < values->size(); ++i) {
      (*half)[i] = dtype == DType::kBF16 ? F32ToBf16((*values)[i]) : F32ToF16((*values)[i]);
    }
    t.data = reinterpret_cast<const std::byte*>(half->data());
    t.nbytes = half->size() * sizeof(uint16_t);
    bytes = std::move(half);
  } else {
    t.dtype = DType::kF32;
    t.data = reinterpret_cast<const std::byte*>(values->data());
    t.nbytes = values->size() * sizeof(float);
  }
  absl::StatusOr<DeviceWeight> w = UploadWeight(t);
  if (w.ok() && w->data == t.data) w->owner = std::move(bytes);  // mapped, not copied
  return w;
}

}  // namespace tandem
