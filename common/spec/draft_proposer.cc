#include "common/spec/draft_proposer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/spec/verify.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<DraftModelProposer>> DraftModelProposer::Create(
    LlamaModel* draft, const Options& options) {
  if (draft == nullptr) return absl::InvalidArgumentError("no draft model");
  if (options.num_blocks < 1 || options.block_size < 1 || options.max_catch_up_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft KV cache of ", options.num_blocks, " blocks of ", options.block_size,
                     " tokens, catch-up budget of ", options.max_catch_up_tokens));
  }
  std::unique_ptr<DraftModelProposer> p(new DraftModelProposer(draft, options));
  ASSIGN_OR_RETURN(
      p->storage_,
      KvCacheStorage::Create(draft->backend(),
                             draft->KvGeometry(options.num_blocks, options.block_size,
                                               draft->KvCacheDType(options.kv_cache_dtype))));
  return p;
}

int64_t DraftModelProposer::BytesPerBlock(const LlamaModel& draft, int64_t block_size,
                                          std::optional<DType> kv_cache_dtype) {
  return KvCacheStorage::BytesPerBlock(
      draft.KvGeometry(1, block_size, draft.KvCacheDType(kv_cache_dtype)));
}

absl::Status DraftModelProposer::Propose(absl::Span<const ProposalRequest> requests,
                                         std::vector<Proposal>* proposals) {
  proposals->clear();
  RETURN_IF_ERROR(ValidateProposalRequests(requests));
  const int64_t vocab = draft_->config().vocab_size;
  const int64_t capacity = options_.num_blocks * options_.block_size;
  for (const ProposalRequest& r : requests) {
    const int64_t room = static_cast<int64_t>(r.block_table.size()) * options_.block_size;
    if (static_cast<int64_t>(r.tokens.size()) + r.k - 1 > room || room > capacity ||
        r.draft_computed < 0 || r.draft_computed > static_cast<int64_t>(r.tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", r.seq_id, ": ", r.tokens.size(), " tokens and ", r.k, " to propose, ",
          r.draft_computed, " with draft KV, in ", r.block_table.size(), " blocks"));
    }
    for (int32_t b : r.block_table) {
      if (b < 0 || b >= options_.num_blocks)
        return absl::InvalidArgumentError(absl::StrCat("sequence ", r.seq_id, ": block ", b));
    }
  }
  proposals->resize(requests.size());
  // Each sequence's tokens are its request's then its proposal's; the draft holds KV for the first
  // `computed`. The first round computes what each sequence lacks, as far as the call's catch-up
  // budget goes (a sequence that does not get all of it proposes nothing this time); each later
  // round computes the latest proposed token of every sequence still proposing. A sequence whose
  // round reaches its last token gets that token's logits, and so its next proposed token.
  std::vector<int64_t> computed(requests.size());
  std::vector<bool> proposing(requests.size());
  int64_t catch_up_left = options_.max_catch_up_tokens;
  for (size_t i = 0; i < requests.size(); ++i) {
    computed[i] = std::min<int64_t>(requests[i].draft_computed,
                                    static_cast<int64_t>(requests[i].tokens.size()) - 1);
    const int64_t need = static_cast<int64_t>(requests[i].tokens.size()) - computed[i];
    proposing[i] = need <= std::max<int64_t>(catch_up_left, 1);
    catch_up_left -= need;
  }
  auto known = [&](size_t i) {
    return static_cast<int64_t>(requests[i].tokens.size() + (*proposals)[i].tokens.size());
  };
  auto token_at = [&](size_t i, int64_t p) {
    const int64_t n = static_cast<int64_t>(requests[i].tokens.size());
    return p < n ? requests[i].tokens[p] : (*proposals)[i].tokens[p - n];
  };
  std::vector<float> logits;
  std::vector<int32_t> argmax;
  catch_up_left = options_.max_catch_up_tokens;
  for (bool first = true;; first = false) {
    ForwardInput in;
    std::vector<size_t> row_seq;  // per logits row: its sequence
    for (size_t i = 0; i < requests.size(); ++i) {
      const ProposalRequest& r = requests[i];
      if (!first && (!proposing[i] || static_cast<int32_t>((*proposals)[i].tokens.size()) >= r.k))
        continue;
      int64_t end = known(i);
      if (!proposing[i]) end = std::min(end, computed[i] + std::max<int64_t>(0, catch_up_left));
      if (end <= computed[i]) continue;
      if (first) catch_up_left -= end - computed[i];
      const int64_t row0 = static_cast<int64_t>(in.token_ids.size());
      for (int64_t p = computed[i]; p < end; ++p) in.token_ids.push_back(token_at(i, p));
      in.seqs.push_back({end - computed[i], computed[i],
                         std::vector<int32_t>(r.block_table.begin(), r.block_table.end())});
      if (proposing[i]) {
        in.logits_rows.push_back(static_cast<int32_t>(row0 + (end - computed[i]) - 1));
        in.argmax_only.push_back(r.sampler == nullptr ? 1 : 0);
        row_seq.push_back(i);
      }
      computed[i] = end;
    }
    if (in.seqs.empty()) break;
    in.allow_graph = true;  // rounds of one token per sequence replay a captured graph
    RETURN_IF_ERROR(draft_->runner().Forward(in, storage_.get(), &logits, &argmax));
    for (size_t row = 0; row < row_seq.size(); ++row) {
      const size_t i = row_seq[row];
      SequenceSampler* sampler = requests[i].sampler;
      Proposal& out = (*proposals)[i];
      if (sampler == nullptr) {
        out.tokens.push_back(argmax[row]);
        continue;
      }
      const std::span<const float> logits_row(logits.data() + row * vocab, vocab);
      int32_t token;
      if (sampler->params().greedy() || sampler->params().top_k == 1) {
        token = sampler->Sample(logits_row, workspace_);  // its processors, then the argmax
      } else {
        sampler->Distribution(logits_row, workspace_, &probs_);
        token = DrawFromDistribution(probs_, sampler->Uniform());
        out.probs.insert(out.probs.end(), probs_.begin(), probs_.end());
      }
      sampler->Accept(token);
      out.tokens.push_back(token);
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) (*proposals)[i].draft_computed = computed[i];
  return absl::OkStatus();
}

}  // namespace tandem
