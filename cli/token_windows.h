// Token windows a model runs over, shared by `tandem eval` (the text it scores) and
// `tandem quantize` (its calibration text): read, cut, checked against the model, and run as
// chunked prefills on a KV cache of one window.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/kv_cache_storage.h"
#include "common/model/llama_model.h"

namespace tandem::cli {

struct TokenWindows {
  std::vector<std::vector<int32_t>> windows;
  int64_t predicted = 0;  // tokens predicted from their window's context: Σ (size − 1)
};

// The windows of `text_file` (UTF-8, tokenized with the model's tokenizer and its special tokens,
// cut into windows of `context` tokens overlapping by one, so every token after the first is
// predicted once) or of `windows_file` (JSON {"windows": [[id, ...], ...]}, each as is); exactly
// one of the two is set. Every window is checked against `context` and the vocabulary; with
// `max_predicted` > 0 the windows stop (the last one cut) once that many tokens are predicted.
// INVALID_ARGUMENT naming the file and window, NOT_FOUND for a file that cannot be opened.
absl::StatusOr<TokenWindows> LoadTokenWindows(const std::string& model_dir,
                                              const std::string& text_file,
                                              const std::string& windows_file, int64_t context,
                                              int64_t vocab, int64_t max_predicted);

// --context's default for `model`: the smaller of 1024 and its context; INVALID_ARGUMENT when an
// explicit `requested` is outside [2, its context].
absl::StatusOr<int64_t> WindowContext(const LlamaModel& model, int64_t requested);

// One model and a KV cache for one window of up to `context` tokens.
class WindowRunner {
 public:
  static absl::StatusOr<std::unique_ptr<WindowRunner>> Create(std::unique_ptr<LlamaModel> model,
                                                              std::optional<DType> kv_dtype,
                                                              int64_t context);
  LlamaModel& model() { return *model_; }

  // Runs tokens [begin, begin + n) of `window`, whose earlier tokens are already in the cache;
  // `logits` gets [n][vocab] (every row), or, when null, no row's logits are computed.
  absl::Status Chunk(const std::vector<int32_t>& window, int64_t begin, int64_t n,
                     std::vector<float>* logits);

 private:
  WindowRunner() = default;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCacheStorage> kv_;
  std::vector<int32_t> table_;
  std::vector<float> discard_;
};

// "\r<label> [####.....]  42% 420/1000 <unit>, 35 <unit>/s " on stderr, redrawn at most five
// times a second (and at the end); nothing when disabled.
class ProgressBar {
 public:
  ProgressBar(const char* label, const char* unit, int64_t total, bool enabled);
  void Update(int64_t done);
  // Ends the line (when anything was drawn); a later Update draws on a new line.
  void Finish();

 private:
  const char* label_;
  const char* unit_;
  int64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_;
  double last_draw_ = -1;
};

}  // namespace tandem::cli
