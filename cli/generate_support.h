// What `tandem generate` shares between its in-process mode (generate_command.cc) and its server
// mode (remote_generate.cc): the request flags, the batch file, and the JSON output.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "common/chat/tool_calls.h"
#include "common/engine/engine.h"
#include "common/sampling/sampler.h"
#include "common/tokenizer/text_stream.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generation.pb.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, token_ids);
ABSL_DECLARE_FLAG(std::string, batch_file);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::vector<std::string>, stop);
ABSL_DECLARE_FLAG(std::string, messages_file);

namespace tandem::cli {

// Everything one request produced.
struct Collected {
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> token_ids;
  std::vector<LogprobEntry> logprobs;
  std::optional<std::vector<std::optional<LogprobEntry>>> prompt_logprobs;
  std::string finish_reason;
  int64_t num_cached_tokens = 0;
  std::optional<TextStream> text_stream;  // detokenizer and stop strings (with a tokenizer)
  std::string text;
  double first_token_seconds = 0;
  double finish_seconds = 0;
  std::optional<SpeculationCounts> speculation;  // when the request speculated
  std::optional<nlohmann::ordered_json> chat;    // a chat request's parsed output
};

// A conversation rendered with the model's chat template, as the router renders it.
struct RenderedChat {
  std::string text;
  std::vector<int32_t> prompt_token_ids;  // the text encoded without added special tokens
  chat::ToolCallFormat tool_call_format = chat::ToolCallFormat::kNone;
};

// --messages-file (with --tools-file, --kwargs, --template-name) as the public API's chat input,
// generation prompt on; nullopt without --messages-file.
absl::StatusOr<std::optional<v1::ChatInput>> ChatInputFromFlags();
// In-process: renders `input` with the template of the model in `model_dir` and tokenizes it;
// the tool-call format from --tool-call-parser.
absl::StatusOr<RenderedChat> RenderChatLocally(const std::string& model_dir,
                                               const v1::ChatInput& input,
                                               const Tokenizer& tokenizer);

nlohmann::json EntryToJson(const LogprobEntry& e);
// {"prompt_token_ids", "token_ids", "text", "finish_reason", "prompt_logprobs", "logprobs"}, and
// "speculation": {"proposed", "accepted"} when the request speculated, "chat": {"content",
// "tool_calls"} for a chat request.
nlohmann::json ResultJson(const Collected& c, const SamplingParams& p);
// Sampling parameters from the flags (the defaults of every request).
absl::StatusOr<SamplingParams> ParamsFromFlags();
// --batch-file: one request per line, with its prompt text ("" for token ids). Without a tokenizer
// text prompts are not encoded (prompt_token_ids stays empty). Per-line "stop" lists go to `stops`.
absl::StatusOr<std::vector<std::pair<EngineRequest, std::string>>> ReadBatchFile(
    const std::string& path, const SamplingParams& defaults, const Tokenizer* tokenizer,
    std::map<std::string, std::vector<std::string>>* stops);
// Prints the error; exit code 2 for INVALID_ARGUMENT, else 1.
int GenerateFail(const absl::Status& s);

int RemoteGenerateCommand();

}  // namespace tandem::cli
