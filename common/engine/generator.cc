#include "common/engine/generator.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(LlamaModel* model,
                                                             const Options& options) {
  if (options.block_size <= 0 || options.block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be in [1, 1024], got ", options.block_size));
  }
  if (options.prefill_chunk < 0) {
    return absl::InvalidArgumentError("prefill_chunk must be >= 0");
  }
  return std::unique_ptr<Generator>(new Generator(model, options));
}

absl::Status Generator::Validate(const GenerateRequest& req) const {
  const ModelConfig& c = model_->config();
  const int64_t prompt_len = static_cast<int64_t>(req.prompt_token_ids.size());
  if (prompt_len == 0) return absl::InvalidArgumentError("the prompt has no tokens");
  for (size_t i = 0; i < req.prompt_token_ids.size(); ++i) {
    const int32_t t = req.prompt_token_ids[i];
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", t, " at index ", i,
                                                     " is outside the vocabulary [0, ",
                                                     c.vocab_size, ")"));
    }
  }
  SamplingLimits limits;
  limits.vocab_size = c.vocab_size;
  limits.max_model_len = c.max_position_embeddings;
  limits.prompt_len = prompt_len;
  limits.max_logprobs = options_.max_logprobs;
  return req.params.Validate(limits);
}

absl::StatusOr<GenerateResult> Generator::Generate(const GenerateRequest& req,
                                                   const std::function<void(int32_t)>& on_token) {
  RETURN_IF_ERROR(Validate(req));
  const ModelConfig& c = model_->config();
  const SamplingParams& p = req.params;
  const int64_t prompt_len = static_cast<int64_t>(req.prompt_token_ids.size());

  // KV cache sized for this request; blocks in reverse physical order.
  const int64_t bs = options_.block_size;
  const int64_t max_len = prompt_len + std::max(p.max_tokens, 1);
  const int64_t num_blocks = (max_len + bs - 1) / bs;
  ASSIGN_OR_RETURN(auto kv, KvCacheStorage::Create(model_->backend(), model_->KvGeometry(num_blocks, bs)));
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  if (options_.scatter_blocks) std::reverse(table.begin(), table.end());

  GenerateResult result;
  result.prompt_token_ids = req.prompt_token_ids;
  const bool want_prompt_logprobs = p.prompt_logprobs >= 0;
  if (want_prompt_logprobs) result.prompt_logprobs.resize(prompt_len);
  const int64_t vocab = c.vocab_size;
  std::vector<int32_t> eos_token_ids;
  if (c.eos_token_id >= 0) eos_token_ids.push_back(static_cast<int32_t>(c.eos_token_id));
  SequenceSampler sampler(p, req.prompt_token_ids, vocab, std::move(eos_token_ids));
  std::vector<float> logits;

  // Prefill, chunk by chunk.
  const auto t_prefill = std::chrono::steady_clock::now();
  const int64_t chunk = options_.prefill_chunk > 0 ? options_.prefill_chunk : prompt_len;
  std::vector<float> last_logits(vocab);
  for (int64_t begin = 0; begin < prompt_len; begin += chunk) {
    const int64_t end = std::min(prompt_len, begin + chunk);
    ForwardInput in;
    in.token_ids.assign(req.prompt_token_ids.begin() + begin, req.prompt_token_ids.begin() + end);
    in.seqs.push_back({end - begin, begin, table});
    if (want_prompt_logprobs) {
      for (int64_t i = begin; i < end; ++i) in.logits_rows.push_back(static_cast<int32_t>(i - begin));
    } else if (end == prompt_len) {
      in.logits_rows.push_back(static_cast<int32_t>(end - begin - 1));
    }
    RETURN_IF_ERROR(model_->Forward(in, kv.get(), &logits));
    if (want_prompt_logprobs) {
      // Row i predicts token i + 1.
      for (int64_t i = begin; i < end; ++i) {
        const float* row = logits.data() + (i - begin) * vocab;
        if (i + 1 < prompt_len) {
          result.prompt_logprobs[i + 1] =
              ComputeLogprobs(row, vocab, req.prompt_token_ids[i + 1], p.prompt_logprobs);
        }
      }
    }
    if (end == prompt_len) {
      const float* row = logits.data() + (logits.size() / vocab - 1) * vocab;
      std::copy(row, row + vocab, last_logits.begin());
    }
  }
  result.prefill_seconds = SecondsSince(t_prefill);

  // Decode.
  const auto t_decode = std::chrono::steady_clock::now();
  result.finish_reason = "length";
  int64_t context = prompt_len;
  for (int32_t step = 0; step < p.max_tokens; ++step) {
    const int32_t token = sampler.Sample(last_logits);
    sampler.Accept(token);
    result.token_ids.push_back(token);
    if (p.logprobs >= 0) result.logprobs.push_back(ComputeLogprobs(last_logits.data(), vocab, token, p.logprobs));
    if (on_token) on_token(token);
    if (sampler.IsStop(token, sampler.num_generated())) {
      result.finish_reason = "stop";
      break;
    }
    if (step + 1 == p.max_tokens) break;
    ForwardInput in;
    in.token_ids = {token};
    in.seqs.push_back({1, context, table});
    in.logits_rows = {0};
    RETURN_IF_ERROR(model_->Forward(in, kv.get(), &logits));
    std::copy(logits.begin(), logits.begin() + vocab, last_logits.begin());
    ++context;
  }
  result.decode_seconds = SecondsSince(t_decode);
  return result;
}

}  // namespace tandem
