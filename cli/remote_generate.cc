// `tandem generate --server HOST:PORT`: the same request flags and output as the in-process mode,
// streamed from a Tandem router over gRPC (GenerateStream). A batch file's requests are sent
// concurrently, one stream each.
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/client_auth.h"
#include "cli/commands.h"
#include "cli/generate_support.h"
#include "common/rpc/chat_convert.h"
#include "common/rpc/convert.h"
#include "common/rpc/status.h"
#include "common/rpc/tls.h"
#include "common/serving/speculation_convert.h"
#include "tandem/v1/generation.grpc.pb.h"

ABSL_FLAG(std::string, server, "",
          "generate: stream from a Tandem router at HOST:PORT instead of running in-process");
ABSL_FLAG(double, timeout_s, 0,
          "generate --server: deadline of each request in seconds (0 = the router's default)");
ABSL_FLAG(int32_t, priority, 0, "generate --server: higher runs first among queued requests");

ABSL_DECLARE_FLAG(std::string, speculative_method);
ABSL_DECLARE_FLAG(int32_t, num_speculative_tokens);

namespace tandem::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct RemoteResult {
  Collected c;
  SamplingParams params;
  v1::GenerateResponse final;
  grpc::Status status;
};

// Streams one request; `print` writes text deltas to stdout as they come.
void StreamOne(v1::Generation::Stub* stub, const EngineRequest& req, const std::string& text,
               const std::optional<v1::ChatInput>& chat, const std::vector<std::string>& stops,
               bool print, Clock::time_point start, RemoteResult* out) {
  v1::GenerateRequest g;
  g.set_request_id(req.id);
  if (chat) {
    *g.mutable_chat() = *chat;
  } else if (!req.prompt_token_ids.empty()) {
    *g.mutable_prompt_token_ids()->mutable_ids() = {req.prompt_token_ids.begin(),
                                                    req.prompt_token_ids.end()};
  } else {
    g.set_prompt(text);
    g.set_add_special_tokens(true);
  }
  *g.mutable_sampling() = rpc::ToProto(req.params);
  for (const std::string& s : stops) g.mutable_sampling()->add_stop(s);
  g.mutable_sampling()->set_skip_special_tokens(true);
  // The request's speculation, when --speculative-method gave one (else the decode worker's).
  if (req.speculation) {
    *g.mutable_sampling()->mutable_speculation() =
        SpeculationToProto(*req.speculation, req.num_speculative_tokens);
  }
  g.set_priority(absl::GetFlag(FLAGS_priority));
  grpc::ClientContext ctx;
  AddApiKey(&ctx);
  if (absl::GetFlag(FLAGS_timeout_s) > 0) {
    rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
  }
  auto reader = stub->GenerateStream(&ctx, g);
  v1::GenerateStreamResponse r;
  Collected& c = out->c;
  while (reader->Read(&r)) {
    const double now = std::chrono::duration<double>(Clock::now() - start).count();
    if (r.has_delta()) {
      const v1::TextDelta& d = r.delta();
      if (c.token_ids.empty() && d.token_ids_size() > 0) c.first_token_seconds = now;
      c.token_ids.insert(c.token_ids.end(), d.token_ids().begin(), d.token_ids().end());
      for (const auto& l : d.logprobs()) c.logprobs.push_back(rpc::FromProto(l));
      c.text += d.text();
      if (print) {
        std::fwrite(d.text().data(), 1, d.text().size(), stdout);
        std::fflush(stdout);
      }
    } else if (r.has_final()) {
      out->final = r.final();
      c.finish_reason = rpc::FinishReasonName(r.final().finish_reason());
      c.num_cached_tokens = r.final().usage().cached_prompt_tokens();
      if (r.final().has_speculation()) {
        c.speculation = SpeculationCounts{r.final().speculation().proposed(),
                                          r.final().speculation().accepted()};
      }
      if (r.final().has_chat()) {
        c.chat = rpc::ChatOutputToJson(r.final().chat());
        c.prompt_token_ids.assign(r.final().prompt_token_ids().begin(),
                                  r.final().prompt_token_ids().end());
      }
      c.finish_seconds = now;
      if (r.final().prompt_logprobs_size() > 0) {
        c.prompt_logprobs.emplace();
        for (int i = 0; i < r.final().prompt_logprobs_size(); ++i) {
          if (i == 0) {
            c.prompt_logprobs->push_back(std::nullopt);
          } else {
            c.prompt_logprobs->push_back(rpc::FromProto(r.final().prompt_logprobs(i)));
          }
        }
      }
    }
  }
  out->status = reader->Finish();
}

json TimingsJson(const v1::Timings& t) {
  return {{"router_queue", t.router_queue()},
          {"prefill_queue", t.prefill_queue()},
          {"prefill_compute", t.prefill_compute()},
          {"kv_transfer", t.kv_transfer()},
          {"decode_queue", t.decode_queue()},
          {"time_to_first_token", t.time_to_first_token()},
          {"end_to_end", t.end_to_end()}};
}

}  // namespace

int RemoteGenerateCommand() {
  const std::string server = absl::GetFlag(FLAGS_server);
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  const std::string token_ids = absl::GetFlag(FLAGS_token_ids);
  const std::string batch_file = absl::GetFlag(FLAGS_batch_file);
  absl::StatusOr<std::optional<v1::ChatInput>> chat = ChatInputFromFlags();
  if (!chat.ok()) return GenerateFail(chat.status());
  if ((prompt.empty() ? 0 : 1) + (token_ids.empty() ? 0 : 1) + (batch_file.empty() ? 0 : 1) +
          (chat->has_value() ? 1 : 0) !=
      1) {
    return GenerateFail(absl::InvalidArgumentError(
        "give exactly one of --prompt, --token-ids, --batch-file or --messages-file"));
  }
  auto defaults = ParamsFromFlags();
  if (!defaults.ok()) return GenerateFail(defaults.status());
  std::optional<SpeculationMethod> speculation;
  if (const std::string m = absl::GetFlag(FLAGS_speculative_method); !m.empty()) {
    absl::StatusOr<SpeculationMethod> method = ParseSpeculationMethod(m);
    if (!method.ok())
      return GenerateFail(absl::InvalidArgumentError(
          absl::StrCat("--speculative-method: ", method.status().message())));
    speculation = *method;
  }
  std::vector<std::pair<EngineRequest, std::string>> requests;
  std::map<std::string, std::vector<std::string>> stops;
  if (!batch_file.empty()) {
    auto read = ReadBatchFile(batch_file, *defaults, nullptr, &stops);
    if (!read.ok()) return GenerateFail(read.status());
    requests = *std::move(read);
    if (requests.empty())
      return GenerateFail(absl::InvalidArgumentError(batch_file + ": no requests"));
  } else {
    EngineRequest r;
    r.params = *defaults;
    if (!token_ids.empty()) {
      auto ids = ParseIds("--token-ids", token_ids);
      if (!ids.ok()) return GenerateFail(ids.status());
      r.prompt_token_ids = *std::move(ids);
    }
    requests.emplace_back(std::move(r), prompt);
  }
  for (auto& [req, text] : requests) {
    req.speculation = speculation;
    req.num_speculative_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> made = rpc::ChannelFromFlags(server);
  if (!made.ok()) return GenerateFail(made.status());
  std::shared_ptr<grpc::Channel> channel = *std::move(made);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return GenerateFail(
        absl::UnavailableError(absl::StrCat("cannot reach the router at ", server)));
  }
  auto stub = v1::Generation::NewStub(channel);
  const bool as_json = absl::GetFlag(FLAGS_json);
  const bool single = batch_file.empty();
  std::vector<RemoteResult> results(requests.size());
  if (single && !as_json) {
    std::fputs(prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    results[i].params = requests[i].first.params;
    const std::vector<std::string>& s = stops.contains(requests[i].first.id)
                                            ? stops[requests[i].first.id]
                                            : absl::GetFlag(FLAGS_stop);
    threads.emplace_back(StreamOne, stub.get(), std::cref(requests[i].first),
                         std::cref(requests[i].second), std::cref(*chat), s, single && !as_json,
                         start, &results[i]);
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();

  // The prompt ids of text prompts, for the JSON output.
  auto prompt_ids = [&](size_t i) -> std::vector<int32_t> {
    if (!requests[i].first.prompt_token_ids.empty()) return requests[i].first.prompt_token_ids;
    v1::TokenizeRequest t;
    t.set_text(requests[i].second);
    t.set_add_special_tokens(true);
    v1::TokenizeResponse tr;
    grpc::ClientContext ctx;
    AddApiKey(&ctx);
    if (!stub->Tokenize(&ctx, t, &tr).ok()) return {};
    return {tr.ids().begin(), tr.ids().end()};
  };
  if (single) {
    RemoteResult& r = results[0];
    if (!r.status.ok()) {
      if (!as_json) std::fputc('\n', stdout);
      return GenerateFail(rpc::FromGrpc(r.status));
    }
    if (as_json) {
      if (!chat->has_value()) r.c.prompt_token_ids = prompt_ids(0);
      json out = ResultJson(r.c, r.params);
      out["timings"] = TimingsJson(r.final.timings());
      std::puts(out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    } else {
      std::fputc('\n', stdout);
      std::fflush(stdout);  // the text before the summary on stderr, also when stdout is a pipe
      const v1::Timings& t = r.final.timings();
      std::fprintf(
          stderr,
          "finish_reason=%s prompt=%d tokens (%d cached), first token after %.3f s (prefill queue "
          "%.3f, compute %.3f, KV transfer %.3f), generated=%zu tokens in %.3f s\n",
          r.c.finish_reason.c_str(), r.final.usage().prompt_tokens(),
          r.final.usage().cached_prompt_tokens(), t.time_to_first_token(), t.prefill_queue(),
          t.prefill_compute(), t.kv_transfer(), r.c.token_ids.size(), t.end_to_end());
    }
    return 0;
  }
  int failed = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    RemoteResult& r = results[i];
    json out;
    if (r.status.ok()) {
      r.c.prompt_token_ids = prompt_ids(i);
      out = ResultJson(r.c, r.params);
      out["num_cached_tokens"] = r.c.num_cached_tokens;
      out["first_token_seconds"] = r.c.first_token_seconds;
      out["finish_seconds"] = r.c.finish_seconds;
      out["timings"] = TimingsJson(r.final.timings());
    } else {
      ++failed;
      out["error"] = {{"code", static_cast<int>(r.status.error_code())},
                      {"message", r.status.error_message()}};
    }
    out["id"] = requests[i].first.id;
    std::puts(out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  }
  std::fprintf(stderr, "batch: %zu requests (%d failed) in %.2f s\n", results.size(), failed, wall);
  return failed == 0 ? 0 : 1;
}

}  // namespace tandem::cli
