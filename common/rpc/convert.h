// Translation between the proto messages of proto/tandem/v1 and the domain types of the engine.
// Services stay thin: they call these and the engine, nothing else.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/sampling/finish_reason.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {
class Tokenizer;
}

namespace tandem::rpc {

// Unset optional fields keep the SamplingParams defaults. Stop strings and skip_special_tokens
// are the router's business and are not part of SamplingParams.
SamplingParams FromProto(const v1::SamplingParameters& p);
v1::SamplingParameters ToProto(const SamplingParams& p);

// The token text is filled when a tokenizer is given.
v1::PositionLogprobs ToProto(const LogprobEntry& e, const Tokenizer* tokenizer = nullptr);
LogprobEntry FromProto(const v1::PositionLogprobs& p);

// Prompt logprobs as the engine reports them (entry 0 has no distribution).
void AppendPromptLogprobs(const std::vector<std::optional<LogprobEntry>>& entries,
                          const std::vector<int32_t>& prompt,
                          google::protobuf::RepeatedPtrField<v1::PositionLogprobs>* out);

// The public API's finish: stop, length, abort; UNSPECIFIED for kNone and kPrefillDone (no request
// of the public API ends there).
v1::FinishReason ToProto(FinishReason reason);
std::string FinishReasonName(v1::FinishReason reason);

}  // namespace tandem::rpc
