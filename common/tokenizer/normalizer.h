// tokenizer.json "normalizer": NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, Sequence.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer_internal {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `s` is valid UTF-8 and stays so.
  virtual std::string Normalize(std::string s) const = 0;
};

// Null JSON → nullptr (no normalizer). Unsupported types are refused naming them.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& j);

}  // namespace tandem::tokenizer_internal
