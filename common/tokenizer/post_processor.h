// tokenizer.json "post_processor": TemplateProcessing (e.g. BOS + sequence), ByteLevel (no change
// to ids), BertProcessing / RobertaProcessing (CLS + sequence + SEP), Sequence. Only the single-
// sequence template is used: Tandem encodes one text at a time.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer_internal {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Applies the template to `ids` when add_special_tokens.
  virtual std::vector<int32_t> Process(std::vector<int32_t> ids) const = 0;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const nlohmann::json& j);

}  // namespace tandem::tokenizer_internal
