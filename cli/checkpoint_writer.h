// Writing a Hugging Face checkpoint's weights: model.safetensors, or shards of a bounded size with
// model.safetensors.index.json (make-model's random models and padded models). Tensors are filled
// one shard at a time, so a multi-gigabyte model never sits in memory whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor/dtype.h"

namespace tandem {

// One tensor to write: `fill` writes its bytes() bytes.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::function<void(std::byte* out)> fill;
  uint64_t bytes() const;
};

// Writes `tensors` (in order) under `dir`, first removing the weights of an earlier run so a stale
// shard or index cannot shadow the new files. `progress` (nullable): (bytes written, total).
absl::Status WriteCheckpointWeights(const std::string& dir, const std::vector<TensorSpec>& tensors,
                                    uint64_t max_shard_bytes,
                                    const std::function<void(uint64_t, uint64_t)>& progress);

// Copies the tokenizer's files and the generation defaults of `from_dir` into `out_dir` as they
// are (not the weights, the config, or notes about the model such as a README).
absl::Status CopyTokenizerFiles(const std::string& from_dir, const std::string& out_dir);

// Writes `text` to `path` (truncating).
absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace tandem
