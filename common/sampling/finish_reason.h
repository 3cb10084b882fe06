// Why a sequence stopped producing tokens: the engine reports it, the services translate it to the
// proto enum (common/rpc/convert.h), the CLI and metrics print its name.
#pragma once

namespace tandem {

enum class FinishReason {
  kNone,         // still running (no output has carried a finish yet)
  kStop,         // a stop token id or stop string ended it (EOS unless ignored)
  kLength,       // max_tokens, or the model's context length
  kAbort,        // cancelled, timed out, or its worker was told to drop it
  kPrefillDone,  // prefill role: the prompt is computed and the first token sampled; decode
                 // continues
};

// "stop", "length", "abort", "prefill_done"; "" for kNone. The names of the public API and the
// `tandem generate --json` output.
inline const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kPrefillDone: return "prefill_done";
    case FinishReason::kNone: break;
  }
  return "";
}

}  // namespace tandem
