// Speculative decoding with a draft model: a small model with the target's tokenizer guesses each
// sequence's next k tokens, one forward pass of the draft per token for the whole batch.
//
// The draft's KV cache is laid out as the target's: the same number of blocks of the same size,
// addressed by the target's block tables, so one pool's accounting covers both (a block holds the
// target's KV and the draft's for the same tokens) and a sequence's blocks, rollback and release
// are the target's. The draft computes the KV of a sequence's tokens itself, catching up from what
// it holds (ProposalRequest::draft_computed): a decode worker whose prompt KV arrived for the
// target computes the draft's prompt KV in the sequence's first proposal.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/kv_cache_storage.h"
#include "common/model/llama_model.h"
#include "common/sampling/sampler.h"
#include "common/spec/proposer.h"

namespace tandem {

class DraftModelProposer final : public Proposer {
 public:
  struct Options {
    int64_t num_blocks = 0;  // the target's pool: blocks, and tokens per block
    int64_t block_size = 16;
    std::optional<DType> kv_cache_dtype;  // as the target's --kv-cache-dtype
    // Most tokens one Propose call computes while catching up, all sequences together (the step
    // budget): a sequence that cannot catch up within it proposes nothing this time, and goes on
    // from its progress (Proposal::draft_computed) the next.
    int64_t max_catch_up_tokens = 512;
  };
  // `draft` must outlive the proposer and share the target's vocabulary (the caller checks the
  // tokenizer). Allocates the draft's KV cache on its backend.
  static absl::StatusOr<std::unique_ptr<DraftModelProposer>> Create(LlamaModel* draft,
                                                                    const Options& options);
  // Bytes one block of the draft's KV cache takes (the pool's blocks grow by this much).
  static int64_t BytesPerBlock(const LlamaModel& draft, int64_t block_size,
                               std::optional<DType> kv_cache_dtype);

  SpeculationMethod method() const override { return SpeculationMethod::kDraft; }
  // Every request needs its block table; the draft catches up to requests[i].tokens and proposes
  // requests[i].k tokens, drawn by requests[i].sampler (with their distributions) or its argmax;
  // none for a sequence whose catch-up does not fit the call's budget (see Options).
  absl::Status Propose(absl::Span<const ProposalRequest> requests,
                       std::vector<Proposal>* proposals) override;

  const LlamaModel& model() const { return *draft_; }

 private:
  DraftModelProposer(LlamaModel* draft, const Options& options)
      : draft_(draft), options_(options) {}

  LlamaModel* draft_;
  Options options_;
  std::unique_ptr<KvCacheStorage> storage_;
  SamplingWorkspace workspace_;
  std::vector<float> probs_;  // [vocab] one row's distribution
};

}  // namespace tandem
