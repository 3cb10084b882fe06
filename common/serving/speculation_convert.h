// Speculative decoding between the gRPC API and the engine: a request's
// SamplingParameters.speculation into EngineRequest's fields, and its counts back into
// SpeculationCounts messages.
#pragma once

#include "common/engine/engine.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

// Unspecified method: the worker's default; num_tokens as given (the engine validates its range).
void SpeculationFromProto(const v1::Speculation& speculation, EngineRequest* request);
v1::Speculation SpeculationToProto(SpeculationMethod method, int32_t num_tokens);
v1::SpeculationCounts ToProto(const SpeculationCounts& counts);

}  // namespace tandem
