// A request as the scheduler sees it: token ids (prompt then output) and how many are computed.
// There is no prefill or decode phase: a request has tokens computed and tokens to compute.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

enum class RequestState { kWaiting, kRunning, kPreempted, kFinished, kHandedOut };

struct SchedRequest {
  std::string id;
  std::vector<int32_t> token_ids;  // prompt, then generated tokens
  int64_t prompt_len = 0;
  int64_t max_tokens = 0;           // generated-token cap (for capacity checks)
  int64_t num_computed_tokens = 0;  // tokens whose KV is in the cache
  int64_t num_cached_tokens = 0;    // of those, taken from the prefix cache at admission
  int64_t num_preemptions = 0;
  RequestState state = RequestState::kWaiting;
  uint64_t arrival = 0;          // admission order
  bool use_prefix_cache = true;  // off when every prompt position's logits are needed
  // Speculative decoding. The most tokens the engine may propose after token_ids in the next step
  // (0: none), which the scheduler makes room for, and the tokens proposed: computed with the
  // sequence's next token and verified, never part of token_ids until kept.
  int32_t spec_budget = 0;
  std::vector<int32_t> draft_tokens;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_output_tokens() const { return num_tokens() - prompt_len; }
};

}  // namespace tandem
