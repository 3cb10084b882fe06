#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
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
#include "cli/generate_support.h"
#include "common/base/file.h"
#include "common/base/status_macros.h"
#include "common/engine/engine.h"
#include "common/model/llama_model.h"
#include "common/rpc/chat_convert.h"
#include "common/sampling/sampling_params.h"
#include "common/serving/engine_flags.h"
#include "common/structured/token_vocabulary.h"
#include "common/tokenizer/stop_strings.h"
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
ABSL_FLAG(
    double, frequency_penalty, 0.0,
    "generate: in [-2, 2]; subtracted from a generated token's logit per occurrence (0 = off)");
ABSL_FLAG(int32_t, min_tokens, 0,
          "generate: EOS and stop ids cannot end generation before N tokens");
ABSL_FLAG(std::string, stop_token_ids, "", "generate: comma-separated ids that end generation");
ABSL_FLAG(std::vector<std::string>, stop, {},
          "generate: stop strings, comma-separated: generation ends at the first match, which the "
          "text leaves out (in-process, and by the router with --server)");
ABSL_FLAG(std::string, logit_bias, "",
          "generate: comma-separated id:bias pairs added to the logits, bias in [-100, 100]");
ABSL_FLAG(int32_t, prompt_logprobs, -1,
          "generate: top-K logprobs for every prompt token (-1 = off)");
ABSL_FLAG(int32_t, logprobs, -1, "generate: top-K logprobs for every generated token (-1 = off)");
ABSL_FLAG(bool, ignore_eos, false, "generate: keep generating past the end-of-sequence token");
ABSL_FLAG(std::string, json_schema, "",
          "generate: FILE holding a JSON Schema; the output is JSON valid against it (structured "
          "output, docs/structured_output.md; ends with EOS once complete)");
ABSL_FLAG(bool, json_object, false,
          "generate: the output is a JSON object (structured output; ends with EOS once complete)");
ABSL_FLAG(std::string, batch_file, "",
          "generate: JSONL of requests submitted together ({\"prompt\": ...} or {\"token_ids\": "
          "[...]}, optional \"id\", \"max_tokens\", \"temperature\", \"top_p\", \"top_k\", "
          "\"seed\", \"ignore_eos\"; other sampling flags apply to all)");
ABSL_FLAG(bool, json, false, "generate, tokenize, detokenize: print JSON instead of text");

namespace tandem::cli {

using nlohmann::json;

json EntryToJson(const LogprobEntry& e) {
  json top = json::array();
  for (const TokenLogprob& t : e.top)
    top.push_back({{"token_id", t.token_id}, {"logprob", t.logprob}});
  return {{"token_id", e.token_id}, {"logprob", e.logprob}, {"rank", e.rank}, {"top", top}};
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

int GenerateFail(const absl::Status& s) {
  std::fprintf(stderr, "tandem generate: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

namespace {
int Fail(const absl::Status& s) { return GenerateFail(s); }
}  // namespace

// Sampling parameters from the flags (the defaults of every request).
absl::StatusOr<SamplingParams> ParamsFromFlags() {
  SamplingParams p;
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
  if (!stop_token_ids.ok()) return stop_token_ids.status();
  p.stop_token_ids = *std::move(stop_token_ids);
  auto logit_bias = ParseLogitBias(absl::GetFlag(FLAGS_logit_bias));
  if (!logit_bias.ok()) return logit_bias.status();
  p.logit_bias = *std::move(logit_bias);
  p.seed = absl::GetFlag(FLAGS_seed);
  p.logprobs = absl::GetFlag(FLAGS_logprobs);
  p.prompt_logprobs = absl::GetFlag(FLAGS_prompt_logprobs);
  p.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  if (const std::string schema_file = absl::GetFlag(FLAGS_json_schema); !schema_file.empty()) {
    if (absl::GetFlag(FLAGS_json_object)) {
      return absl::InvalidArgumentError("--json-schema and --json-object: choose one");
    }
    absl::StatusOr<std::string> schema = ReadFileToString(schema_file);
    if (!schema.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--json-schema: ", schema.status().message()));
    }
    p.structured_output.kind = StructuredOutput::Kind::kJsonSchema;
    p.structured_output.json_schema = *std::move(schema);
  } else if (absl::GetFlag(FLAGS_json_object)) {
    p.structured_output.kind = StructuredOutput::Kind::kJsonObject;
  }
  return p;
}

namespace {

absl::StatusOr<EngineOptions> EngineOptionsFromFlags(const ModelConfig& config) {
  ASSIGN_OR_RETURN(EngineOptions o, tandem::EngineOptionsFromFlags());
  // Whole distributions are allowed here: the conformance tests compare them against llama.cpp.
  o.max_logprobs = static_cast<int32_t>(
      std::min<int64_t>(config.vocab_size, std::numeric_limits<int32_t>::max()));
  return o;
}

}  // namespace

json ResultJson(const Collected& c, const SamplingParams& p) {
  json out;
  out["prompt_token_ids"] = c.prompt_token_ids;
  out["token_ids"] = c.token_ids;
  out["text"] = c.text;
  out["finish_reason"] = c.finish_reason;
  if (c.chat) out["chat"] = json::parse(c.chat->dump());
  if (c.speculation) {
    out["speculation"] = {{"proposed", c.speculation->proposed},
                          {"accepted", c.speculation->accepted}};
  }
  if (p.prompt_logprobs >= 0 && c.prompt_logprobs) {
    json pl = json::array();
    for (const auto& e : *c.prompt_logprobs) pl.push_back(e ? EntryToJson(*e) : json(nullptr));
    out["prompt_logprobs"] = pl;
  } else {
    out["prompt_logprobs"] = nullptr;
  }
  if (p.logprobs >= 0) {
    json lp = json::array();
    for (const auto& e : c.logprobs) lp.push_back(EntryToJson(e));
    out["logprobs"] = lp;
  } else {
    out["logprobs"] = nullptr;
  }
  return out;
}

// Reads --batch-file: one request per line.
absl::StatusOr<std::vector<std::pair<EngineRequest, std::string>>> ReadBatchFile(
    const std::string& path, const SamplingParams& defaults, const Tokenizer* tokenizer,
    std::map<std::string, std::vector<std::string>>* stops) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<std::pair<EngineRequest, std::string>> out;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", line_no, ": ");
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object())
      return absl::InvalidArgumentError(where + "each line must be a JSON object");
    EngineRequest r;
    r.params = defaults;
    r.id = j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>()
                                                   : absl::StrCat("line", line_no);
    std::string prompt_text;
    try {
      if (j.contains("prompt") && j["prompt"].is_string()) {
        prompt_text = j["prompt"].get<std::string>();
        // Without a tokenizer (a remote server tokenizes), the text travels as it is.
        if (tokenizer != nullptr)
          r.prompt_token_ids = tokenizer->Encode(prompt_text, /*add_special_tokens=*/true);
      } else if (j.contains("token_ids") && j["token_ids"].is_array()) {
        r.prompt_token_ids = j["token_ids"].get<std::vector<int32_t>>();
      } else {
        return absl::InvalidArgumentError(where +
                                          "needs \"prompt\" (string) or \"token_ids\" (list)");
      }
      if (j.contains("max_tokens")) r.params.max_tokens = j["max_tokens"].get<int32_t>();
      if (j.contains("temperature")) r.params.temperature = j["temperature"].get<float>();
      if (j.contains("top_p")) r.params.top_p = j["top_p"].get<float>();
      if (j.contains("top_k")) r.params.top_k = j["top_k"].get<int32_t>();
      if (j.contains("seed")) r.params.seed = j["seed"].get<uint64_t>();
      if (j.contains("ignore_eos")) r.params.ignore_eos = j["ignore_eos"].get<bool>();
      if (j.contains("logprobs")) r.params.logprobs = j["logprobs"].get<int32_t>();
      if (j.contains("stop")) stops->emplace(r.id, j["stop"].get<std::vector<std::string>>());
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(where, "bad field: ", e.what()));
    }
    out.emplace_back(std::move(r), std::move(prompt_text));
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& flag, const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", piece, "' is not an integer token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

int GenerateCommand() {
  if (!absl::GetFlag(FLAGS_server).empty()) return RemoteGenerateCommand();
  using Clock = std::chrono::steady_clock;
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  const std::string token_ids = absl::GetFlag(FLAGS_token_ids);
  const std::string batch_file = absl::GetFlag(FLAGS_batch_file);
  if (model_dir.empty()) return Fail(absl::InvalidArgumentError("--model DIR is required"));
  const bool chat = !absl::GetFlag(FLAGS_messages_file).empty();
  if ((prompt.empty() ? 0 : 1) + (token_ids.empty() ? 0 : 1) + (batch_file.empty() ? 0 : 1) +
          (chat ? 1 : 0) !=
      1) {
    return Fail(absl::InvalidArgumentError(
        "give exactly one of --prompt, --token-ids, --batch-file or --messages-file"));
  }
  absl::StatusOr<std::optional<v1::ChatInput>> chat_input = ChatInputFromFlags();
  if (!chat_input.ok()) return Fail(chat_input.status());
  auto defaults = ParamsFromFlags();
  if (!defaults.ok()) return Fail(defaults.status());
  const auto t0 = Clock::now();
  auto backend = BackendFromFlags();
  if (!backend.ok()) return Fail(backend.status());
  auto load_options = ModelLoadOptionsFromFlags();
  if (!load_options.ok()) return Fail(load_options.status());
  auto model = LlamaModel::Load(model_dir, backend->get(), *load_options);
  if (!model.ok()) return Fail(model.status());
  const ModelConfig& config = (*model)->config();
  // Needed for text prompts; with token ids a missing or unsupported tokenizer only costs the text.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(model_dir);
  const Tokenizer* tok = tokenizer.ok() ? tokenizer->get() : nullptr;

  std::vector<std::pair<EngineRequest, std::string>> requests;
  chat::ToolCallFormat tool_call_format = chat::ToolCallFormat::kNone;
  // By request id: --stop, or a batch line's "stop".
  std::map<std::string, std::vector<std::string>> stops;
  if (!batch_file.empty()) {
    auto read = ReadBatchFile(batch_file, *defaults, tok, &stops);
    if (!read.ok()) return Fail(read.status());
    requests = *std::move(read);
    if (requests.empty()) return Fail(absl::InvalidArgumentError(batch_file + ": no requests"));
  } else {
    EngineRequest r;
    r.id = "request";
    r.params = *defaults;
    std::string text = prompt;
    if (!token_ids.empty()) {
      auto ids = ParseIds("--token-ids", token_ids);
      if (!ids.ok()) return Fail(ids.status());
      r.prompt_token_ids = *std::move(ids);
    } else if (chat) {
      if (!tokenizer.ok()) return Fail(tokenizer.status());
      auto rendered = RenderChatLocally(model_dir, **chat_input, *tok);
      if (!rendered.ok()) return Fail(rendered.status());
      r.prompt_token_ids = std::move(rendered->prompt_token_ids);
      text = std::move(rendered->text);
      tool_call_format = rendered->tool_call_format;
    } else {
      if (!tokenizer.ok()) return Fail(tokenizer.status());
      r.prompt_token_ids = tok->Encode(prompt, /*add_special_tokens=*/true);
    }
    requests.emplace_back(std::move(r), text);
  }
  // Mistral's [TOOL_CALLS] marker is a special token: a chat with tools keeps them in its text, as
  // the router does, so the tool-call parser sees it.
  const bool skip_special_tokens = !(chat && tool_call_format == chat::ToolCallFormat::kMistral &&
                                     !(*chat_input)->tools_json().empty());
  auto engine_options = EngineOptionsFromFlags(config);
  if (!engine_options.ok()) return Fail(engine_options.status());
  if (tok != nullptr) {
    engine_options->vocabulary =
        structured::TokenVocabulary::FromTokenizer(*tok, config.vocab_size);
  }
  absl::StatusOr<std::unique_ptr<LlamaModel>> draft = DraftModelFromFlags(model_dir, **model);
  if (!draft.ok()) return Fail(draft.status());
  engine_options->speculation.draft = draft->get();
  auto engine = Engine::Create(model->get(), *engine_options);
  if (!engine.ok()) return Fail(engine.status());
  const double load_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  const bool as_json = absl::GetFlag(FLAGS_json);
  const bool single = batch_file.empty();
  std::map<std::string, Collected> results;
  std::vector<std::string> order;
  for (auto& [req, text] : requests) {
    if (results.contains(req.id))
      return Fail(absl::InvalidArgumentError("duplicate request id \"" + req.id + "\""));
    Collected& c = results[req.id];
    c.prompt_token_ids = req.prompt_token_ids;
    order.push_back(req.id);
    const std::vector<std::string>& req_stops =
        stops.contains(req.id) ? stops[req.id] : absl::GetFlag(FLAGS_stop);
    absl::Status valid = StopStringMatcher::Validate(req_stops);
    if (valid.ok() && !req_stops.empty() && tok == nullptr) {
      valid = absl::FailedPreconditionError("stop strings need the model's tokenizer: " +
                                            std::string(tokenizer.status().message()));
    }
    if (!valid.ok()) {
      if (single)
        return Fail(absl::Status(valid.code(), absl::StrCat("--stop: ", valid.message())));
      std::fprintf(stderr, "tandem generate: request %s refused: \"stop\": %s\n", req.id.c_str(),
                   std::string(valid.message()).c_str());
      c.finish_reason = "refused";
      continue;
    }
    // Streamed text: the prompt ids give the first generated token its context (its leading
    // space); the JSON "text" is the same text, as vLLM's.
    if (tok != nullptr)
      c.text_stream.emplace(tok, skip_special_tokens, req.prompt_token_ids, req_stops);
    if (absl::Status s = (*engine)->AddRequest(req); !s.ok()) {
      if (single) return Fail(s);
      std::fprintf(stderr, "tandem generate: request %s refused: %s\n", req.id.c_str(),
                   std::string(s.message()).c_str());
      c.finish_reason = "refused";
    }
  }
  if (single && !as_json) {
    std::fprintf(stderr, "loaded %s (%s, %lld layers) on %s in %.2f s\n", model_dir.c_str(),
                 config.architecture.c_str(), static_cast<long long>(config.num_hidden_layers),
                 (*backend)->device_description().c_str(), load_seconds);
    std::fputs(prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  const auto start = Clock::now();
  while ((*engine)->HasWork()) {
    auto outs = (*engine)->Step();
    if (!outs.ok()) return Fail(outs.status());
    const double now = std::chrono::duration<double>(Clock::now() - start).count();
    for (RequestOutput& o : *outs) {
      Collected& c = results[o.id];
      if (o.speculation) c.speculation = o.speculation;
      if (c.text_stream && c.text_stream->stopped())
        continue;  // ended by a stop string: its abort's output
      if (c.token_ids.empty() && !o.new_token_ids.empty()) c.first_token_seconds = now;
      // Several tokens at once (a speculative step's run) end at the one that completes a stop
      // string.
      size_t used = o.new_token_ids.size();
      std::string delta;
      if (c.text_stream) delta = c.text_stream->Add(o.new_token_ids, &used);
      c.token_ids.insert(c.token_ids.end(), o.new_token_ids.begin(),
                         o.new_token_ids.begin() + used);
      c.logprobs.insert(c.logprobs.end(), o.new_logprobs.begin(),
                        o.new_logprobs.begin() + std::min(used, o.new_logprobs.size()));
      if (o.prompt_logprobs) c.prompt_logprobs = std::move(o.prompt_logprobs);
      c.num_cached_tokens = std::max(c.num_cached_tokens, o.num_cached_tokens);
      if (c.text_stream) {
        if (single && !as_json) {
          std::fwrite(delta.data(), 1, delta.size(), stdout);
          std::fflush(stdout);
        }
        if (c.text_stream->stopped()) {  // as the router does: the request ends at the stop string
          c.finish_reason = FinishReasonName(FinishReason::kStop);
          c.finish_seconds = now;
          if (!o.finished) {
            if (absl::Status s = (*engine)->Abort(o.id); !s.ok()) return Fail(s);
          }
          continue;
        }
      }
      if (o.finished) {
        c.finish_reason = FinishReasonName(o.finish_reason);
        c.finish_seconds = now;
      }
    }
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();

  int64_t prompt_tokens = 0, generated = 0;
  for (const std::string& id : order) {
    Collected& c = results[id];
    prompt_tokens += static_cast<int64_t>(c.prompt_token_ids.size());
    generated += static_cast<int64_t>(c.token_ids.size());
    bool streamed_ok = false;
    if (c.text_stream) {
      absl::Status detokenized;
      const std::string rest = c.text_stream->Finish(&detokenized);
      streamed_ok = detokenized.ok() || c.text_stream->stopped();
      if (single && !as_json) std::fwrite(rest.data(), 1, rest.size(), stdout);
      if (!detokenized.ok()) {  // a detokenizer bug: say so rather than print wrong text
        std::fprintf(stderr, "\ntandem generate: %s\n", std::string(detokenized.message()).c_str());
      }
      if (streamed_ok) c.text = c.text_stream->text();
    }
    if (!streamed_ok && tok != nullptr) {
      auto decoded = tok->Decode(c.token_ids, skip_special_tokens);
      if (decoded.ok()) c.text = *decoded;
    }
  }
  const SamplingParams& p = requests.front().first.params;
  if (single) {
    Collected& c = results[order.front()];
    if (chat)
      c.chat =
          rpc::ChatOutputToJson(rpc::ChatOutputFromText(c.text, tool_call_format, order.front()));
    if (as_json) {
      std::puts(ResultJson(c, p).dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    } else {
      std::fputc('\n', stdout);
      std::fflush(stdout);  // the text before the summary on stderr, also when stdout is a pipe
      const double decode = c.finish_seconds - c.first_token_seconds;
      std::fprintf(
          stderr,
          "finish_reason=%s prompt=%zu tokens (%zu cached), first token after %.3f s, "
          "generated=%zu tokens (%.1f tok/s)\n",
          c.finish_reason.c_str(), c.prompt_token_ids.size(),
          static_cast<size_t>(c.num_cached_tokens), c.first_token_seconds, c.token_ids.size(),
          c.token_ids.size() > 1 ? (c.token_ids.size() - 1) / std::max(decode, 1e-9) : 0.0);
    }
    return 0;
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const Collected& c = results[order[i]];
    json out = ResultJson(c, requests[i].first.params);
    out["id"] = order[i];
    out["num_cached_tokens"] = c.num_cached_tokens;
    out["first_token_seconds"] = c.first_token_seconds;
    out["finish_seconds"] = c.finish_seconds;
    std::puts(out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  }
  const EngineStats st = (*engine)->stats();
  std::fprintf(stderr,
               "batch: %zu requests, %lld prompt tokens (%lld from the prefix cache), %lld "
               "generated in %.2f s: %.2f requests/s, %.1f generated tokens/s, %.1f total "
               "tokens/s; %lld steps, %lld preemptions\n",
               order.size(), static_cast<long long>(prompt_tokens),
               static_cast<long long>(st.prefix_hits), static_cast<long long>(generated), wall,
               order.size() / std::max(wall, 1e-9), generated / std::max(wall, 1e-9),
               (prompt_tokens + generated) / std::max(wall, 1e-9), static_cast<long long>(st.steps),
               static_cast<long long>(st.preemptions));
  return 0;
}

}  // namespace tandem::cli
