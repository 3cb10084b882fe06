#include "common/spec/ngram_proposer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<NgramProposer>> NgramProposer::Create(const Options& options) {
  if (options.min_n < 1 || options.min_n > options.max_n || options.max_n > kMaxNgram) {
    return absl::InvalidArgumentError(
        absl::StrCat("n-gram lookup needs 1 <= --ngram-min <= --ngram-max <= ", kMaxNgram, "; got ",
                     options.min_n, " and ", options.max_n));
  }
  return std::unique_ptr<NgramProposer>(new NgramProposer(options));
}

std::vector<int32_t> NgramProposer::ProposeOne(absl::Span<const int32_t> tokens, int32_t k) const {
  const int64_t len = static_cast<int64_t>(tokens.size());
  // Longest n first; an occurrence [j - n, j) must end before the sequence does (j < len), so that
  // tokens[j] exists to propose. Scanning j downwards finds the most recent one first.
  for (int64_t n = std::min<int64_t>(options_.max_n, len - 1); n >= options_.min_n; --n) {
    const int32_t* suffix = tokens.data() + (len - n);
    for (int64_t j = len - 1; j >= n; --j) {
      if (!std::equal(suffix, suffix + n, tokens.data() + (j - n))) continue;
      const int64_t end = std::min<int64_t>(len, j + k);
      return std::vector<int32_t>(tokens.begin() + j, tokens.begin() + end);
    }
  }
  return {};
}

absl::Status NgramProposer::Propose(absl::Span<const ProposalRequest> requests,
                                    std::vector<Proposal>* proposals) {
  proposals->clear();
  if (absl::Status s = ValidateProposalRequests(requests); !s.ok()) return s;
  proposals->reserve(requests.size());
  for (const ProposalRequest& r : requests) proposals->push_back({ProposeOne(r.tokens, r.k), {}});
  return absl::OkStatus();
}

}  // namespace tandem
