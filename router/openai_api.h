// The OpenAI-compatible HTTP API's translation, with no I/O: request bodies of /v1/completions and
// /v1/chat/completions into the public API's GenerateRequests (one per choice), and the public
// API's results back into OpenAI's JSON (responses, stream chunks, errors). http_frontend.cc serves
// it. Field names, defaults and shapes follow OpenAI's API reference; Tandem's extra sampling
// fields are accepted as vLLM accepts them (top_k, min_p, repetition_penalty, ignore_eos,
// min_tokens, chat_template_kwargs, add_generation_prompt, skip_special_tokens).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generation.pb.h"

namespace tandem::router::openai {

using Json = nlohmann::ordered_json;

enum class Endpoint { kCompletions, kChatCompletions };

// A request that passed validation.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int n = 1;
  // One GenerateRequest per choice, in choice-index order (prompt i's choices are i*n .. i*n+n-1).
  std::vector<v1::GenerateRequest> choices;
  // Logprobs asked: completions' `logprobs` (top-K, 0 = the chosen token only), or chat's
  // `top_logprobs` when `logprobs` is true; -1 when none.
  int32_t logprobs = -1;
  bool echo = false;                   // completions: the prompt text before each choice's text
  std::vector<std::string> echo_text;  // per choice, when echo
  bool parse_tool_calls = false;       // chat with tools and tool_choice other than none
  // tool_choice required or a named function: the output is a JSON array of calls (generated
  // under structured output), never content.
  bool forced_tool_calls = false;
};

// NotFound for a model this router does not serve; InvalidArgument naming the field for everything
// else wrong (malformed JSON, a wrong type, a value out of range, an unknown field, a feature
// Tandem does not offer such as tool_choice "required").
absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, const std::string& body,
                                           const std::string& served_model, int32_t max_logprobs);

// {"error": {"message", "type", "param", "code"}} and its HTTP status, for a Tandem status.
struct ApiError {
  int http_status = 500;
  std::string body;
};
ApiError ErrorFor(const absl::Status& status);

// A choice's whole result (text, token ids and logprobs gathered) for the non-streamed responses.
struct ChoiceResult {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<v1::PositionLogprobs> logprobs;
  v1::GenerateResponse final;  // finish_reason, usage, chat
};

Json CompletionResponse(const ParsedRequest& request, const std::string& id, int64_t created,
                        const std::vector<ChoiceResult>& choices, const Tokenizer& tokenizer);

// Streaming: chunks as OpenAI sends them (each framed as `data: JSON\n\n` by the caller).
Json CompletionChunk(const ParsedRequest& request, const std::string& id, int64_t created,
                     int index, const std::string& text, const Json& logprobs,
                     const std::string& finish_reason);
Json ChatChunk(const ParsedRequest& request, const std::string& id, int64_t created, int index,
               const Json& delta, const Json& logprobs, const std::string& finish_reason);
Json UsageChunk(const ParsedRequest& request, const std::string& id, int64_t created,
                int64_t prompt_tokens, int64_t completion_tokens);
// A delta's logprobs in the endpoint's shape (null when none were asked); `text_offset` is where
// the delta's text starts in the choice's text (completions only).
Json DeltaLogprobs(const ParsedRequest& request, const std::vector<v1::PositionLogprobs>& logprobs,
                   const Tokenizer& tokenizer, int64_t text_offset);
// The final delta of a streamed chat choice with tool calls: content and tool_calls at once.
Json ToolCallDelta(const v1::ChatOutput& output);
std::string FinishReasonName(v1::FinishReason reason, bool tool_calls);
// Python's len() of UTF-8 text: what `text_offset` counts.
int64_t CodePoints(const std::string& text);

// GET /v1/models.
Json ModelList(const v1::ModelInfo& model, int64_t created);

}  // namespace tandem::router::openai
