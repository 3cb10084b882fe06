// tokenizer.json "decoder": ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence.
// A decoder maps the list of token strings to the list of output pieces; Decode joins them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer_internal {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> Decode(std::vector<std::string> tokens) const = 0;
  // The bytes one token adds in the middle of a decode: Decode's per-token mapping without what
  // depends on the neighbours (UTF-8 repair, stripping at the start, fusing).
  virtual std::string RawToken(std::string token) const { return token; }
};

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& j);

}  // namespace tandem::tokenizer_internal
