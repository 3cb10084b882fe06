// What a sequence's output must follow, token by token (structured output: a JSON schema, any JSON
// object). The sampler consults it before every draw: tokens it does not allow get -inf, and end
// of sequence is allowed only where the constraint is complete. common/structured implements it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace tandem {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The tokens that may come next, as bits over the vocabulary ([ceil(vocab / 64)] words, bit
  // `id % 64` of word `id / 64`). End of sequence is not among them: see CanEnd().
  virtual void AllowedTokens(std::vector<uint64_t>* bits) = 0;
  // Whether the output so far is complete (end of sequence may come now).
  virtual bool CanEnd() const = 0;
  // Records `token` as generated. false when the constraint does not allow it (the constraint is
  // then dead: nothing more is allowed and it never becomes complete).
  virtual bool Accept(int32_t token) = 0;
  // A copy at the same point (a draft's proposals, a fork).
  virtual std::unique_ptr<TokenConstraint> Clone() const = 0;
};

}  // namespace tandem
