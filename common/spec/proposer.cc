#include "common/spec/proposer.h"

#include "absl/strings/str_cat.h"

namespace tandem {

std::string_view SpeculationMethodName(SpeculationMethod method) {
  switch (method) {
    case SpeculationMethod::kOff: return "off";
    case SpeculationMethod::kNgram: return "ngram";
    case SpeculationMethod::kDraft: return "draft";
  }
  return "off";
}

absl::StatusOr<SpeculationMethod> ParseSpeculationMethod(std::string_view name) {
  for (SpeculationMethod m :
       {SpeculationMethod::kOff, SpeculationMethod::kNgram, SpeculationMethod::kDraft}) {
    if (name == SpeculationMethodName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("speculation method '", std::string(name), "' is not one of off, ngram, draft"));
}

absl::Status ValidateProposalRequests(absl::Span<const ProposalRequest> requests) {
  for (const ProposalRequest& r : requests) {
    if (r.k < 1 || r.k > kMaxSpeculativeTokens) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", r.seq_id, ": ", r.k,
                                                     " speculative tokens, not in [1, ",
                                                     kMaxSpeculativeTokens, "]"));
    }
    if (r.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", r.seq_id, ": nothing to propose after an empty sequence"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
