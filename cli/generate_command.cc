#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/engine/generator.h"
#include "common/model/llama_model.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(std::optional<uint64_t>, seed);
ABSL_FLAG(std::string, model, "",
          "generate: Hugging Face model directory; tokenize, detokenize: a model directory or a "
          "tokenizer.json file");
ABSL_FLAG(std::string, prompt, "",
          "generate: prompt text (encoded with the model's tokenizer.json)");
ABSL_FLAG(std::string, token_ids, "", "generate: prompt as comma-separated token ids");
ABSL_FLAG(int32_t, max_tokens, 16, "generate: tokens to generate (0 evaluates the prompt only)");
ABSL_FLAG(double, temperature, 1.0, "generate: sampling temperature (0 = greedy)");
ABSL_FLAG(double, top_p, 1.0, "generate: nucleus sampling mass in (0, 1]");
ABSL_FLAG(int32_t, top_k, 0, "generate: keep the K most likely tokens (0 or -1 = off)");
ABSL_FLAG(double, min_p, 0.0,
          "generate: drop tokens less likely than P × the most likely one, P in [0, 1] (0 = off)");
ABSL_FLAG(double, repetition_penalty, 1.0,
          "generate: > 0; divides positive and multiplies negative logits of tokens in the prompt "
          "or output (1 = off)");
ABSL_FLAG(double, presence_penalty, 0.0,
          "generate: in [-2, 2]; subtracted from the logit of every generated token (0 = off)");
ABSL_FLAG(double, frequency_penalty, 0.0,
          "generate: in [-2, 2]; subtracted from a generated token's logit per occurrence "
          "(0 = off)");
ABSL_FLAG(int32_t, min_tokens, 0,
          "generate: EOS and stop ids cannot end generation before N tokens");
ABSL_FLAG(std::string, stop_token_ids, "", "generate: comma-separated ids that end generation");
ABSL_FLAG(std::string, logit_bias, "",
          "generate: comma-separated id:bias pairs added to the logits, bias in [-100, 100]");
ABSL_FLAG(int32_t, prompt_logprobs, -1, "generate: top-K logprobs for every prompt token (-1 = off)");
ABSL_FLAG(int32_t, logprobs, -1, "generate: top-K logprobs for every generated token (-1 = off)");
ABSL_FLAG(bool, ignore_eos, false, "generate: keep generating past the end-of-sequence token");
ABSL_FLAG(int64_t, prefill_chunk, 0, "generate: evaluate the prompt in chunks of N tokens (0 = whole)");
ABSL_FLAG(int64_t, block_size, 16, "generate: KV cache block size in tokens");
ABSL_FLAG(bool, json, false, "generate, tokenize, detokenize: print JSON instead of text");

namespace tandem::cli {
namespace {

using nlohmann::json;

json EntryToJson(const LogprobEntry& e) {
  json top = json::array();
  for (const TokenLogprob& t : e.top) top.push_back({{"token_id", t.token_id}, {"logprob", t.logprob}});
  return {{"token_id", e.token_id}, {"logprob", e.logprob}, {"rank", e.rank}, {"top", top}};
}

// "1,2,3" → ids; INVALID_ARGUMENT naming `flag` for a piece that is not an integer.
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& flag, const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", piece, "' is not an integer"));
    }
    ids.push_back(id);
  }
  return ids;
}

// "id:bias,id:bias" → logit biases.
absl::StatusOr<std::vector<LogitBias>> ParseLogitBias(const std::string& text) {
  std::vector<LogitBias> biases;
  for (absl::string_view pair : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> parts = absl::StrSplit(pair, ':');
    LogitBias b;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &b.token_id) ||
        !absl::SimpleAtof(parts[1], &b.bias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--logit-bias: '", pair, "' is not token_id:bias"));
    }
    biases.push_back(b);
  }
  return biases;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem generate: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int GenerateCommand() {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  const std::string token_ids = absl::GetFlag(FLAGS_token_ids);
  if (model_dir.empty()) return Fail(absl::InvalidArgumentError("--model DIR is required"));
  if (prompt.empty() == token_ids.empty()) {
    return Fail(absl::InvalidArgumentError("give exactly one of --prompt or --token-ids"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto backend = CpuBackend::Create({});
  if (!backend.ok()) return Fail(backend.status());
  auto model = LlamaModel::Load(model_dir, backend->get());
  if (!model.ok()) return Fail(model.status());
  const ModelConfig& config = (*model)->config();
  // Needed for --prompt; with --token-ids a missing or unsupported tokenizer only costs the text.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(model_dir);

  GenerateRequest req;
  if (!token_ids.empty()) {
    auto ids = ParseIds("--token-ids", token_ids);
    if (!ids.ok()) return Fail(ids.status());
    req.prompt_token_ids = *std::move(ids);
  } else {
    if (!tokenizer.ok()) return Fail(tokenizer.status());
    req.prompt_token_ids = (*tokenizer)->Encode(prompt, /*add_special_tokens=*/true);
  }
  SamplingParams& p = req.params;
  p.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  p.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  p.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  p.top_k = absl::GetFlag(FLAGS_top_k);
  p.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  p.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  p.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  p.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  p.min_tokens = absl::GetFlag(FLAGS_min_tokens);
  auto stop_token_ids = ParseIds("--stop-token-ids", absl::GetFlag(FLAGS_stop_token_ids));
  if (!stop_token_ids.ok()) return Fail(stop_token_ids.status());
  p.stop_token_ids = *std::move(stop_token_ids);
  auto logit_bias = ParseLogitBias(absl::GetFlag(FLAGS_logit_bias));
  if (!logit_bias.ok()) return Fail(logit_bias.status());
  p.logit_bias = *std::move(logit_bias);
  p.seed = absl::GetFlag(FLAGS_seed);
  p.logprobs = absl::GetFlag(FLAGS_logprobs);
  p.prompt_logprobs = absl::GetFlag(FLAGS_prompt_logprobs);
  p.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);

  Generator::Options gen_options;
  gen_options.block_size = absl::GetFlag(FLAGS_block_size);
  gen_options.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  // Whole distributions are allowed here: the conformance tests compare them against llama.cpp.
  gen_options.max_logprobs = static_cast<int32_t>(
      std::min<int64_t>(config.vocab_size, std::numeric_limits<int32_t>::max()));
  auto generator = Generator::Create(model->get(), gen_options);
  if (!generator.ok()) return Fail(generator.status());
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (absl::Status s = (*generator)->Validate(req); !s.ok()) return Fail(s);
  const bool as_json = absl::GetFlag(FLAGS_json);
  if (!as_json) {
    std::fprintf(stderr, "loaded %s (%s, %lld layers) on %s in %.2f s\n", model_dir.c_str(),
                 config.architecture.c_str(), static_cast<long long>(config.num_hidden_layers),
                 (*backend)->device_description().c_str(), load_seconds);
    if (!prompt.empty()) std::fputs(prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  // Streamed text: the prompt ids give the first generated token its context (its leading space).
  // The JSON "text" is the same text (as vLLM's), so both agree for SentencePiece-style models.
  std::optional<IncrementalDetokenizer> detokenizer;
  if (tokenizer.ok()) {
    detokenizer.emplace(tokenizer->get(), /*skip_special_tokens=*/true, req.prompt_token_ids);
  }
  auto print = [as_json](const std::string& text) {
    if (as_json) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  auto on_token = [&](int32_t id) {
    if (!detokenizer) return;
    // An id the model has but the tokenizer lacks (a padded vocabulary) has no text to print.
    absl::StatusOr<std::string> delta = detokenizer->Add(id);
    if (delta.ok()) print(*delta);
  };
  auto result = (*generator)->Generate(req, on_token);
  if (!result.ok()) return Fail(result.status());
  bool streamed_ok = false;
  if (detokenizer) {
    absl::StatusOr<std::string> rest = detokenizer->Finish();
    streamed_ok = rest.ok();
    if (rest.ok()) {
      print(*rest);
    } else {  // A detokenizer bug: say so rather than print wrong text; the result stands.
      std::fprintf(stderr, "\ntandem generate: %s\n", std::string(rest.status().message()).c_str());
    }
  }

  std::string text;
  if (streamed_ok) text = detokenizer->emitted_text();
  if (!streamed_ok && tokenizer.ok()) {
    auto decoded = (*tokenizer)->Decode(result->token_ids, /*skip_special_tokens=*/true);
    if (decoded.ok()) text = *decoded;
  }
  if (as_json) {
    json out;
    out["prompt_token_ids"] = result->prompt_token_ids;
    out["token_ids"] = result->token_ids;
    out["text"] = text;
    out["finish_reason"] = result->finish_reason;
    if (p.prompt_logprobs >= 0) {
      json pl = json::array();
      for (const auto& e : result->prompt_logprobs) pl.push_back(e ? EntryToJson(*e) : json(nullptr));
      out["prompt_logprobs"] = pl;
    } else {
      out["prompt_logprobs"] = nullptr;
    }
    if (p.logprobs >= 0) {
      json lp = json::array();
      for (const auto& e : result->logprobs) lp.push_back(EntryToJson(e));
      out["logprobs"] = lp;
    } else {
      out["logprobs"] = nullptr;
    }
    std::puts(out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  } else {
    std::fputc('\n', stdout);
    const double n_prompt = static_cast<double>(result->prompt_token_ids.size());
    const double n_out = static_cast<double>(result->token_ids.size());
    std::fprintf(stderr,
                 "finish_reason=%s prompt=%zu tokens (%.1f tok/s) generated=%zu tokens (%.1f tok/s)\n",
                 result->finish_reason.c_str(), result->prompt_token_ids.size(),
                 n_prompt / std::max(result->prefill_seconds, 1e-9), result->token_ids.size(),
                 n_out > 1 ? (n_out - 1) / std::max(result->decode_seconds, 1e-9) : 0.0);
  }
  return 0;
}

}  // namespace tandem::cli
