// The engine's command-line flags, shared by `tandem generate`, the workers and `tandem up` (which
// forwards them to the workers it starts): --kv-cache-memory, --block-size, --max-num-seqs,
// --max-num-batched-tokens, --max-prefill-chunk (alias --prefill-chunk), --max-queued-requests,
// --max-model-len, --enable-prefix-caching, --device, --gpu-memory-utilization, --quantization,
// and speculative
// decoding's --speculative-method, --num-speculative-tokens, --ngram-min/max,
// --speculative-adaptive, --speculative-step-rows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backend.h"
#include "common/backend/create_backend.h"
#include "common/engine/engine.h"
#include "common/model/config.h"
#include "common/model/llama_model.h"

namespace tandem {

// Engine options from the flags; INVALID_ARGUMENT naming the flag for a bad value.
absl::StatusOr<EngineOptions> EngineOptionsFromFlags();

// --device as given ("cpu", "cuda", "cuda:N").
std::string DeviceFromFlags();
// The backend --device names; FAILED_PRECONDITION when it is not available here.
// --device, --batch-invariant, --compute-dtype, --split-gemm-inputs and the --cuda-* tunings;
// INVALID_ARGUMENT naming the flag for a bad value.
absl::StatusOr<BackendOptions> BackendOptionsFromFlags();
absl::StatusOr<std::unique_ptr<Backend>> BackendFromFlags();

// How the model loads: --quantization. INVALID_ARGUMENT naming the flag for a bad value.
absl::StatusOr<LlamaLoadOptions> ModelLoadOptionsFromFlags();

// The draft model --speculative-model names, on the target's backend, or null without the flag.
// INVALID_ARGUMENT naming the flag when its tokenizer.json or vocabulary differs from the
// target's (in `target_dir`) or it does not load.
absl::StatusOr<std::unique_ptr<LlamaModel>> DraftModelFromFlags(const std::string& target_dir,
                                                                const LlamaModel& target);

// The engine flags as "--name=value" arguments, to start another process with the same settings.
std::vector<std::string> EngineFlagArguments();

// "512M", "2G", "1048576" → bytes. INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<int64_t> ParseBytes(const std::string& flag, const std::string& text);

}  // namespace tandem
