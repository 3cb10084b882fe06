// In-process generation for one sequence at a time: the first slice of the engine, used by
// `tandem generate`. It owns a paged KV cache sized for the request, evaluates the prompt (whole or
// in chunks of `prefill_chunk` tokens), then decodes token by token.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/llama_model.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"

namespace tandem {

struct GenerateRequest {
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
};

struct GenerateResult {
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> token_ids;
  std::string finish_reason;  // "length" or "stop"
  // One entry per prompt token; entry 0 is empty (no distribution before the first token).
  std::vector<std::optional<LogprobEntry>> prompt_logprobs;
  std::vector<LogprobEntry> logprobs;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

class Generator {
 public:
  struct Options {
    int64_t block_size = 16;
    int64_t prefill_chunk = 0;  // 0: the whole prompt in one step
    // Lay the sequence's blocks out in reverse physical order, so paging is exercised.
    bool scatter_blocks = true;
    // Cap on logprobs and prompt_logprobs (SamplingLimits::max_logprobs); `tandem generate` passes
    // the vocabulary size so that whole distributions can be compared.
    int32_t max_logprobs = 20;
  };
  static absl::StatusOr<std::unique_ptr<Generator>> Create(LlamaModel* model, const Options& options);

  // INVALID_ARGUMENT naming the problem when the request cannot run (bad prompt ids, any sampling
  // parameter SamplingParams::Validate rejects, including prompt + max_tokens beyond the model's
  // context). Generate() checks this first.
  absl::Status Validate(const GenerateRequest& request) const;

  // `on_token` (optional) is called with each generated token as soon as it is sampled.
  absl::StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                          const std::function<void(int32_t)>& on_token = nullptr);

 private:
  Generator(LlamaModel* model, const Options& options) : model_(model), options_(options) {}
  LlamaModel* model_;
  Options options_;
};

}  // namespace tandem
