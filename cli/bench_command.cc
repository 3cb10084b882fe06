// `tandem bench`: a load generator for a Tandem router (gRPC GenerateStream), reporting what
// `vllm bench serve` reports: completed and failed requests, request and token throughput, TTFT,
// TPOT, ITL and end-to-end latency (mean, P50, P90, P99), and goodput under SLOs. Closed loop at a
// fixed concurrency or open loop at a request rate with Poisson (burstiness 1) or gamma arrivals;
// workloads: random prompts, shared-prefix groups, multi-turn conversations, a JSONL file.
// --sweep-concurrency runs one closed-loop level after another and draws a latency–throughput
// chart (SVG).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "cli/client_auth.h"
#include "cli/commands.h"
#include "common/rpc/status.h"
#include "common/rpc/tls.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generation.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_FLAG(int32_t, concurrency, 0,
          "bench: requests in flight at once (closed loop); 0 with --request-rate = open loop");
ABSL_FLAG(double, request_rate, 0,
          "bench: requests per second (open loop; 0 = closed loop at --concurrency)");
ABSL_FLAG(double, burstiness, 1.0,
          "bench: gamma shape of inter-arrival times (1 = Poisson; < 1 burstier)");
ABSL_FLAG(int32_t, num_requests, 100, "bench: requests to send (ignored with --duration-s)");
ABSL_FLAG(double, duration_s, 0, "bench: send requests for this long instead of --num-requests");
ABSL_FLAG(std::string, workload, "random", "bench: random | shared-prefix | multi-turn | jsonl");
ABSL_FLAG(int32_t, input_len, 128, "bench: prompt tokens (random, multi-turn first turn)");
ABSL_FLAG(int32_t, output_len, 64, "bench: output tokens (EOS ignored, so the length is exact)");
ABSL_FLAG(double, range_ratio, 0.0,
          "bench: lengths drawn uniformly from [len × (1 - r), len × (1 + r)]");
ABSL_FLAG(int32_t, prefix_groups, 4, "bench shared-prefix: distinct shared prefixes");
ABSL_FLAG(int32_t, prefix_len, 256, "bench shared-prefix: tokens of each shared prefix");
ABSL_FLAG(
    int32_t, turns, 4,
    "bench multi-turn: turns per conversation (each turn adds the reply and --input-len tokens)");
ABSL_FLAG(std::string, dataset, "",
          "bench jsonl: one {\"prompt\": ...} or {\"token_ids\": [...]} per line, optional "
          "\"max_tokens\"");
ABSL_FLAG(double, slo_ttft_ms, 0, "bench: goodput SLO on TTFT (0 = none)");
ABSL_FLAG(double, slo_tpot_ms, 0, "bench: goodput SLO on time per output token (0 = none)");
ABSL_FLAG(double, slo_e2e_ms, 0, "bench: goodput SLO on end-to-end latency (0 = none)");
ABSL_FLAG(std::string, json_out, "",
          "bench: write the full result (with every request) to this file");
ABSL_FLAG(std::string, sweep_concurrency, "",
          "bench: closed-loop levels, e.g. 1,4,16,64 (one result each, and a chart)");
ABSL_FLAG(std::string, chart, "",
          "bench --sweep-concurrency: the SVG chart's path (default: bench-sweep.svg)");
ABSL_FLAG(uint64_t, bench_seed, 0, "bench: seed of the workload and arrival times");
ABSL_FLAG(double, bench_temperature, 0, "bench: every request's sampling temperature (0 = greedy)");
ABSL_FLAG(double, bench_top_p, 1, "bench: every request's top_p in (0, 1] (1 = off)");
ABSL_FLAG(std::string, frontend, "grpc",
          "bench: which front door the requests use: grpc (--server) or http (the OpenAI API at "
          "--http-server, /v1/completions streamed)");
ABSL_FLAG(std::string, http_server, "",
          "bench --frontend http: the router's HTTP API (or any OpenAI-compatible server's, e.g. "
          "llama.cpp's llama-server), HOST:PORT");
ABSL_FLAG(int64_t, vocab_size, 0,
          "bench --frontend http without --server: the vocabulary random prompts draw token ids "
          "from (the model's config.json vocab_size); with --server the router says");
ABSL_FLAG(
    int32_t, bench_logprobs, -1,
    "bench: every request's logprobs (top-K; -1 = none). --frontend http counts tokens by the "
    "logprobs each event carries, so it asks 0 when this is -1: give 0 to both front doors to "
    "compare them like for like");

namespace tandem::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Prompt {
  std::vector<int32_t> ids;  // or text
  std::string text;
  int32_t max_tokens = 0;
  int conversation = -1;  // multi-turn: which conversation, turns run in order
};

struct Sample {
  bool ok = false;
  std::string error;
  int input_tokens = 0, output_tokens = 0;
  double start = 0, ttft = 0, e2e = 0;
  std::vector<double> itl;  // seconds between tokens

  // `n` tokens arrived now, for a request sent at `sent`; `last` is when the previous ones did.
  void RecordTokens(int n, Clock::time_point sent, Clock::time_point* last) {
    const auto now = Clock::now();
    if (output_tokens == 0) {
      ttft = std::chrono::duration<double>(now - sent).count();
    } else {
      const double gap = std::chrono::duration<double>(now - *last).count() / n;
      for (int i = 0; i < n; ++i) itl.push_back(gap);
    }
    output_tokens += n;
    *last = now;
  }
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

json Stats(const std::vector<double>& v) {
  const double mean =
      v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  return {{"mean_ms", mean * 1e3},
          {"p50_ms", Percentile(v, 50) * 1e3},
          {"p90_ms", Percentile(v, 90) * 1e3},
          {"p99_ms", Percentile(v, 99) * 1e3}};
}

class Workload {
 public:
  Workload(int64_t vocab, uint64_t seed) : vocab_(vocab), rng_(seed) {}

  absl::Status Build(int n) {
    const std::string kind = absl::GetFlag(FLAGS_workload);
    if (kind == "jsonl") return ReadJsonl(absl::GetFlag(FLAGS_dataset));
    if (kind == "random") {
      for (int i = 0; i < n; ++i)
        prompts_.push_back({RandomIds(Len(absl::GetFlag(FLAGS_input_len))), "", OutLen()});
    } else if (kind == "shared-prefix") {
      const int groups = std::max(1, absl::GetFlag(FLAGS_prefix_groups));
      std::vector<std::vector<int32_t>> prefixes;
      for (int g = 0; g < groups; ++g)
        prefixes.push_back(RandomIds(absl::GetFlag(FLAGS_prefix_len)));
      for (int i = 0; i < n; ++i) {
        Prompt p{prefixes[i % groups], "", OutLen()};
        const std::vector<int32_t> suffix = RandomIds(Len(absl::GetFlag(FLAGS_input_len)));
        p.ids.insert(p.ids.end(), suffix.begin(), suffix.end());
        prompts_.push_back(std::move(p));
      }
    } else if (kind == "multi-turn") {
      const int turns = std::max(1, absl::GetFlag(FLAGS_turns));
      for (int i = 0; i < n; ++i) {
        Prompt p{RandomIds(Len(absl::GetFlag(FLAGS_input_len))), "", OutLen()};
        p.conversation = i / turns;
        prompts_.push_back(std::move(p));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--workload '", kind, "': random, shared-prefix, multi-turn or jsonl"));
    }
    return absl::OkStatus();
  }
  std::vector<Prompt>& prompts() { return prompts_; }
  std::vector<int32_t> RandomIds(int n) {
    std::vector<int32_t> ids(std::max(1, n));
    for (auto& t : ids) t = static_cast<int32_t>(rng_() % static_cast<uint64_t>(vocab_));
    return ids;
  }

 private:
  int Len(int base) {
    const double r = std::clamp(absl::GetFlag(FLAGS_range_ratio), 0.0, 1.0);
    std::uniform_int_distribution<int> d(std::max(1, static_cast<int>(base * (1 - r))),
                                         std::max(1, static_cast<int>(base * (1 + r))));
    return d(rng_);
  }
  int32_t OutLen() { return Len(absl::GetFlag(FLAGS_output_len)); }
  absl::Status ReadJsonl(const std::string& path) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("--dataset ", path, ": cannot open"));
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json j = json::parse(line, nullptr, false);
      if (!j.is_object())
        return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": not a JSON object"));
      Prompt p;
      p.max_tokens = j.value("max_tokens", absl::GetFlag(FLAGS_output_len));
      if (j.contains("prompt") && j["prompt"].is_string()) {
        p.text = j["prompt"].get<std::string>();
      } else if (j.contains("token_ids") && j["token_ids"].is_array()) {
        try {
          p.ids = j["token_ids"].get<std::vector<int32_t>>();
        } catch (const json::exception&) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ":", n, ": token_ids must be integers"));
        }
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", n, ": needs \"prompt\" or \"token_ids\""));
      }
      prompts_.push_back(std::move(p));
    }
    if (prompts_.empty()) return absl::InvalidArgumentError(path + ": no prompts");
    return absl::OkStatus();
  }

  int64_t vocab_;
  std::mt19937_64 rng_;
  std::vector<Prompt> prompts_;
};

// Streams one request and measures it. `reply` (multi-turn) receives the generated ids.
Sample RunOne(v1::Generation::Stub* stub, const Prompt& p, Clock::time_point t0,
              std::vector<int32_t>* reply) {
  Sample s;
  v1::GenerateRequest g;
  if (!p.ids.empty()) {
    *g.mutable_prompt_token_ids()->mutable_ids() = {p.ids.begin(), p.ids.end()};
    s.input_tokens = static_cast<int>(p.ids.size());
  } else {
    g.set_prompt(p.text);
    g.set_add_special_tokens(true);
  }
  g.mutable_sampling()->set_max_tokens(p.max_tokens);
  g.mutable_sampling()->set_ignore_eos(true);
  g.mutable_sampling()->set_temperature(absl::GetFlag(FLAGS_bench_temperature));
  g.mutable_sampling()->set_top_p(absl::GetFlag(FLAGS_bench_top_p));
  if (absl::GetFlag(FLAGS_bench_logprobs) >= 0)
    g.mutable_sampling()->set_logprobs(absl::GetFlag(FLAGS_bench_logprobs));
  grpc::ClientContext ctx;
  AddApiKey(&ctx);
  const auto start = Clock::now();
  s.start = std::chrono::duration<double>(start - t0).count();
  auto reader = stub->GenerateStream(&ctx, g);
  v1::GenerateStreamResponse m;
  auto last = start;
  while (reader->Read(&m)) {
    if (m.has_delta() && m.delta().token_ids_size() > 0) {
      s.RecordTokens(m.delta().token_ids_size(), start, &last);
      if (reply != nullptr)
        reply->insert(reply->end(), m.delta().token_ids().begin(), m.delta().token_ids().end());
    } else if (m.has_final()) {
      s.input_tokens = m.final().usage().prompt_tokens();
    }
  }
  const grpc::Status status = reader->Finish();
  s.e2e = std::chrono::duration<double>(Clock::now() - start).count();
  s.ok = status.ok();
  if (!s.ok)
    s.error = absl::StrCat(static_cast<int>(status.error_code()), ": ", status.error_message());
  return s;
}

// The same request through the OpenAI HTTP API: POST /v1/completions with stream: true, each
// server-sent event's tokens counted from its logprobs.
Sample RunOneHttp(const std::string& host, const std::string& port, const Prompt& p,
                  Clock::time_point t0) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  namespace net = boost::asio;
  Sample s;
  json body = {{"max_tokens", p.max_tokens},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"temperature", absl::GetFlag(FLAGS_bench_temperature)},
               {"top_p", absl::GetFlag(FLAGS_bench_top_p)},
               {"logprobs", std::max(0, absl::GetFlag(FLAGS_bench_logprobs))}};
  if (!p.ids.empty()) {
    body["prompt"] = p.ids;
    s.input_tokens = static_cast<int>(p.ids.size());
  } else {
    body["prompt"] = p.text;
  }
  const auto start = Clock::now();
  s.start = std::chrono::duration<double>(start - t0).count();
  auto last = start;
  int status = 0;
  try {
    net::io_context ioc;
    net::ip::tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.connect(resolver.resolve(host, port));
    stream.socket().set_option(net::ip::tcp::no_delay(true));
    http::request<http::string_body> request{http::verb::post, "/v1/completions", 11};
    request.set(http::field::host, host);
    request.set(http::field::content_type, "application/json");
    if (const std::string key = ApiKey(); !key.empty())
      request.set(http::field::authorization, "Bearer " + key);
    request.body() = body.dump();
    request.prepare_payload();
    http::write(stream, request);
    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);
    http::read_header(stream, buffer, parser);
    status = parser.get().result_int();
    std::string pending;
    char chunk[16384];
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof(chunk);
      beast::error_code ec;
      http::read_some(stream, buffer, parser, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) throw beast::system_error(ec);
      pending.append(chunk, sizeof(chunk) - parser.get().body().size);
      for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
        const std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
        const json j = json::parse(event.substr(6), nullptr, false);
        if (!j.is_object()) continue;
        if (j.contains("error")) {
          s.error = j["error"].value("message", "error");
          continue;
        }
        if (j.contains("usage") && j["usage"].is_object())
          s.input_tokens = j["usage"].value("prompt_tokens", 0);
        if (!j.contains("choices") || j["choices"].empty()) continue;
        // Tokens: the logprobs' tokens (OpenAI's completions shape; an event may carry several),
        // or their "content" list (llama-server's shape); a server that sends one token an event
        // and no logprobs (llama-server with logprobs 0) counts an event with text as one.
        const json& choice = j["choices"][0];
        const json lp = choice.value("logprobs", json());
        int n = 0;
        if (lp.is_object() && lp.contains("tokens") && lp["tokens"].is_array()) {
          n = static_cast<int>(lp["tokens"].size());
        } else if (lp.is_object() && lp.contains("content") && lp["content"].is_array()) {
          n = static_cast<int>(lp["content"].size());
        } else if (choice.contains("text") && choice["text"].is_string() &&
                   !choice["text"].get<std::string>().empty()) {
          n = 1;
        }
        if (n == 0) continue;
        s.RecordTokens(n, start, &last);
      }
    }
    beast::error_code ignored;
    stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ignored);
  } catch (const std::exception& e) {
    s.error = e.what();
  }
  s.e2e = std::chrono::duration<double>(Clock::now() - start).count();
  s.ok = status == 200 && s.error.empty();
  if (!s.ok && s.error.empty()) s.error = absl::StrCat("HTTP ", status);
  return s;
}

struct Progress {
  std::atomic<int> done{0}, failed{0};
  int total = 0;
  bool tty = isatty(2) != 0;
};

void ShowProgress(const Progress& p, double elapsed, bool final_line) {
  const int done = p.done.load();
  const int width = 30;
  const int filled = p.total > 0 ? std::min(width, done * width / std::max(1, p.total)) : 0;
  std::fprintf(stderr, "%s[%s%s] %d/%d requests, %d failed, %.1f s, %.2f req/s%s",
               p.tty ? "\r" : "", std::string(filled, '#').c_str(),
               std::string(width - filled, ' ').c_str(), done, p.total, p.failed.load(), elapsed,
               done / std::max(elapsed, 1e-9), final_line || !p.tty ? "\n" : "");
  std::fflush(stderr);
}

// Runs the workload once at `concurrency` (closed loop) or `rate` (open loop).
json RunLevel(v1::Generation::Stub* stub, std::vector<Prompt> prompts, int concurrency,
              double rate) {
  const double duration = absl::GetFlag(FLAGS_duration_s);
  const bool multi_turn = absl::GetFlag(FLAGS_workload) == "multi-turn";
  std::vector<Sample> samples;
  std::mutex mu;
  Progress progress;
  progress.total = static_cast<int>(prompts.size());
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  auto record = [&](Sample s) {
    progress.done++;
    if (!s.ok) progress.failed++;
    std::lock_guard<std::mutex> lock(mu);
    samples.push_back(std::move(s));
  };
  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    while (!stop) {
      ShowProgress(progress, elapsed(), false);
      for (int i = 0; i < (progress.tty ? 2 : 20) && !stop; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  // Multi-turn: a conversation's turns run in order, each prompt extended by the history.
  std::vector<std::vector<size_t>> units;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (multi_turn && !units.empty() &&
        prompts[units.back().front()].conversation == prompts[i].conversation) {
      units.back().push_back(i);
    } else {
      units.push_back({i});
    }
  }
  auto run_unit = [&](const std::vector<size_t>& unit) {
    std::vector<int32_t> history;
    for (size_t i : unit) {
      if (duration > 0 && elapsed() > duration) return;
      Prompt p = prompts[i];
      if (multi_turn) {
        history.insert(history.end(), p.ids.begin(), p.ids.end());
        p.ids = history;
      }
      std::vector<int32_t> reply;
      if (absl::GetFlag(FLAGS_frontend) == "http") {
        const std::string address = absl::GetFlag(FLAGS_http_server);
        const size_t colon = address.rfind(':');
        record(RunOneHttp(address.substr(0, colon), address.substr(colon + 1), p, t0));
      } else {
        record(RunOne(stub, p, t0, multi_turn ? &reply : nullptr));
      }
      history.insert(history.end(), reply.begin(), reply.end());
    }
  };
  std::vector<std::thread> threads;
  std::atomic<size_t> next{0};  // closed loop: the next unit to run (outlives the threads)
  if (rate <= 0) {
    for (int c = 0; c < std::max(1, concurrency); ++c) {
      threads.emplace_back([&] {
        for (size_t u; (u = next++) < units.size();) run_unit(units[u]);
      });
    }
  } else {
    // Open loop: gamma(shape = burstiness, mean = 1/rate) inter-arrival times.
    std::mt19937_64 rng(absl::GetFlag(FLAGS_bench_seed) + 1);
    const double shape = std::max(1e-3, absl::GetFlag(FLAGS_burstiness));
    std::gamma_distribution<double> gap(shape, 1.0 / (rate * shape));
    double at = 0;
    for (const auto& unit : units) {
      if (duration > 0 && at > duration) break;
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at)));
      threads.emplace_back([&, unit] { run_unit(unit); });
      at += gap(rng);
    }
  }
  for (auto& t : threads) t.join();
  const double wall = elapsed();
  stop = true;
  ticker.join();
  progress.total = static_cast<int>(samples.size());
  ShowProgress(progress, wall, true);

  std::vector<double> ttft, tpot, itl, e2e;
  int completed = 0, failed = 0, good = 0;
  int64_t input = 0, output = 0;
  std::vector<std::string> errors;
  const double slo_ttft = absl::GetFlag(FLAGS_slo_ttft_ms) / 1e3,
               slo_tpot = absl::GetFlag(FLAGS_slo_tpot_ms) / 1e3,
               slo_e2e = absl::GetFlag(FLAGS_slo_e2e_ms) / 1e3;
  json requests = json::array();
  for (const Sample& s : samples) {
    requests.push_back({{"ok", s.ok},
                        {"error", s.error},
                        {"start_s", s.start},
                        {"input_tokens", s.input_tokens},
                        {"output_tokens", s.output_tokens},
                        {"ttft_s", s.ttft},
                        {"e2e_s", s.e2e}});
    if (!s.ok) {
      ++failed;
      if (errors.size() < 5) errors.push_back(s.error);
      continue;
    }
    ++completed;
    input += s.input_tokens;
    output += s.output_tokens;
    ttft.push_back(s.ttft);
    e2e.push_back(s.e2e);
    const double request_tpot = s.output_tokens > 1 ? (s.e2e - s.ttft) / (s.output_tokens - 1) : 0;
    if (s.output_tokens > 1) tpot.push_back(request_tpot);
    itl.insert(itl.end(), s.itl.begin(), s.itl.end());
    if ((slo_ttft <= 0 || s.ttft <= slo_ttft) && (slo_tpot <= 0 || request_tpot <= slo_tpot) &&
        (slo_e2e <= 0 || s.e2e <= slo_e2e)) {
      ++good;
    }
  }
  json r;
  r["concurrency"] = concurrency;
  r["request_rate"] = rate;
  r["burstiness"] = absl::GetFlag(FLAGS_burstiness);
  r["workload"] = absl::GetFlag(FLAGS_workload);
  r["completed"] = completed;
  r["failed"] = failed;
  r["errors"] = errors;
  r["duration_s"] = wall;
  r["request_throughput"] = completed / wall;
  r["input_token_throughput"] = input / wall;
  r["output_token_throughput"] = output / wall;
  r["total_token_throughput"] = (input + output) / wall;
  r["goodput"] = good / wall;
  r["ttft"] = Stats(ttft);
  r["tpot"] = Stats(tpot);
  r["itl"] = Stats(itl);
  r["e2e"] = Stats(e2e);
  r["requests"] = requests;
  return r;
}

void PrintTable(const json& r) {
  std::printf("============ Tandem benchmark ============\n");
  std::printf("%-34s %s\n", "Workload:", r["workload"].get<std::string>().c_str());
  if (r["request_rate"].get<double>() > 0) {
    std::printf("%-34s %.2f req/s (burstiness %.2f)\n",
                "Request rate:", r["request_rate"].get<double>(), r["burstiness"].get<double>());
  } else {
    std::printf("%-34s %d\n", "Concurrency:", r["concurrency"].get<int>());
  }
  std::printf("%-34s %d\n", "Successful requests:", r["completed"].get<int>());
  std::printf("%-34s %d\n", "Failed requests:", r["failed"].get<int>());
  std::printf("%-34s %.2f\n", "Benchmark duration (s):", r["duration_s"].get<double>());
  std::printf("%-34s %.2f\n", "Request throughput (req/s):", r["request_throughput"].get<double>());
  std::printf("%-34s %.2f\n", "Goodput (req/s):", r["goodput"].get<double>());
  std::printf("%-34s %.2f\n",
              "Input token throughput (tok/s):", r["input_token_throughput"].get<double>());
  std::printf("%-34s %.2f\n",
              "Output token throughput (tok/s):", r["output_token_throughput"].get<double>());
  std::printf("%-34s %.2f\n",
              "Total token throughput (tok/s):", r["total_token_throughput"].get<double>());
  for (const char* k : {"ttft", "tpot", "itl", "e2e"}) {
    const json& s = r[k];
    std::string name = k;
    for (auto& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    std::printf("%-8s (ms)  mean %9.2f   P50 %9.2f   P90 %9.2f   P99 %9.2f\n", name.c_str(),
                s["mean_ms"].get<double>(), s["p50_ms"].get<double>(), s["p90_ms"].get<double>(),
                s["p99_ms"].get<double>());
  }
  for (const auto& e : r["errors"]) std::printf("error: %s\n", e.get<std::string>().c_str());
  std::fflush(stdout);
}

// Latency against throughput, one point per concurrency level: TTFT P50/P99 and ITL P50/P99.
std::string SweepChart(const std::vector<json>& levels) {
  const double W = 760, H = 460, left = 70, right = 30, top = 40, bottom = 60;
  double max_x = 1, max_y = 1;
  for (const json& r : levels) {
    max_x = std::max(max_x, r["output_token_throughput"].get<double>());
    for (const char* k : {"ttft", "itl"}) max_y = std::max(max_y, r[k]["p99_ms"].get<double>());
  }
  max_x *= 1.1;
  max_y *= 1.1;
  auto X = [&](double v) { return left + v / max_x * (W - left - right); };
  auto Y = [&](double v) { return H - bottom - v / max_y * (H - top - bottom); };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n<text x=\"%.0f\" y=\"22\" font-size=\"15\">Tandem: latency vs output "
      "throughput (labels: concurrency)</text>\n",
      W, H, left);
  absl::StrAppendFormat(
      &svg, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", left,
      H - bottom, W - right, H - bottom);
  absl::StrAppendFormat(
      &svg, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", left, top,
      left, H - bottom);
  for (int i = 0; i <= 5; ++i) {
    const double xv = max_x * i / 5, yv = max_y * i / 5;
    absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n",
                          X(xv), H - bottom + 18, xv);
    absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.0f</text>\n",
                          left - 6, Y(yv) + 4, yv);
    absl::StrAppendFormat(
        &svg, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#eee\"/>\n", left,
        Y(yv), W - right, Y(yv));
  }
  absl::StrAppendFormat(
      &svg, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">output tokens/s</text>\n",
      (left + W - right) / 2, H - 20);
  absl::StrAppendFormat(&svg,
                        "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" "
                        "text-anchor=\"middle\">latency (ms)</text>\n",
                        (top + H - bottom) / 2, (top + H - bottom) / 2);
  const struct {
    const char* metric;
    const char* pct;
    const char* color;
    const char* dash;
  } series[] = {{"ttft", "p50_ms", "#1f77b4", ""},
                {"ttft", "p99_ms", "#1f77b4", "6,4"},
                {"itl", "p50_ms", "#d62728", ""},
                {"itl", "p99_ms", "#d62728", "6,4"}};
  int legend = 0;
  for (const auto& s : series) {
    std::string points;
    for (const json& r : levels) {
      absl::StrAppendFormat(&points, "%.1f,%.1f ", X(r["output_token_throughput"].get<double>()),
                            Y(r[s.metric][s.pct].get<double>()));
    }
    absl::StrAppendFormat(&svg,
                          "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                          "stroke-dasharray=\"%s\" points=\"%s\"/>\n",
                          s.color, s.dash, points);
    for (const json& r : levels) {
      const double x = X(r["output_token_throughput"].get<double>()),
                   y = Y(r[s.metric][s.pct].get<double>());
      absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x, y,
                            s.color);
      if (std::string(s.pct) == "p99_ms") {
        absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">%d</text>\n",
                              x + 5, y - 5, r["concurrency"].get<int>());
      }
    }
    std::string label = absl::StrCat(s.metric, " ", std::string(s.pct).substr(0, 3));
    for (auto& c : label) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.0f\" y1=\"%d\" x2=\"%.0f\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\" "
        "stroke-dasharray=\"%s\"/><text x=\"%.0f\" y=\"%d\">%s</text>\n",
        left + 20, 55 + legend * 16, left + 50, 55 + legend * 16, s.color, s.dash, left + 56,
        59 + legend * 16, label);
    ++legend;
  }
  svg += "</svg>\n";
  return svg;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem bench: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int BenchCommand() {
  const std::string server = absl::GetFlag(FLAGS_server);
  const bool http_only = absl::GetFlag(FLAGS_frontend) == "http" && server.empty();
  if (server.empty() && !http_only) {
    return Fail(absl::InvalidArgumentError(
        "--server HOST:PORT (a Tandem router) is required (or --frontend http --http-server "
        "HOST:PORT --vocab-size N for another OpenAI-compatible server)"));
  }
  if (http_only && absl::GetFlag(FLAGS_vocab_size) <= 0) {
    return Fail(absl::InvalidArgumentError(
        "--frontend http without --server needs --vocab-size N (the model's vocabulary)"));
  }
  const double rate = absl::GetFlag(FLAGS_request_rate);
  std::vector<int> levels;
  for (absl::string_view c :
       absl::StrSplit(absl::GetFlag(FLAGS_sweep_concurrency), ',', absl::SkipWhitespace())) {
    int v;
    if (!absl::SimpleAtoi(c, &v) || v <= 0) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--sweep-concurrency: '", c, "' is not a positive integer")));
    }
    levels.push_back(v);
  }
  if (!(absl::GetFlag(FLAGS_bench_temperature) >= 0) || !(absl::GetFlag(FLAGS_bench_top_p) > 0) ||
      !(absl::GetFlag(FLAGS_bench_top_p) <= 1)) {
    return Fail(
        absl::InvalidArgumentError("--bench-temperature must be >= 0 and --bench-top-p in (0, 1]"));
  }
  if (rate < 0 || absl::GetFlag(FLAGS_burstiness) <= 0) {
    return Fail(absl::InvalidArgumentError("--request-rate must be >= 0 and --burstiness > 0"));
  }
  if (levels.empty() && rate == 0 && absl::GetFlag(FLAGS_concurrency) <= 0) {
    return Fail(absl::InvalidArgumentError(
        "give --concurrency N, --request-rate R or --sweep-concurrency 1,4,16"));
  }
  const std::string frontend = absl::GetFlag(FLAGS_frontend);
  if (frontend != "grpc" && frontend != "http") {
    return Fail(absl::InvalidArgumentError("--frontend must be grpc or http"));
  }
  if (frontend == "http") {
    const std::string address = absl::GetFlag(FLAGS_http_server);
    if (address.empty() || address.rfind(':') == std::string::npos) {
      return Fail(absl::InvalidArgumentError("--frontend http needs --http-server HOST:PORT"));
    }
    if (absl::GetFlag(FLAGS_workload) == "multi-turn") {
      return Fail(absl::InvalidArgumentError(
          "--workload multi-turn needs --frontend grpc (it feeds back token ids)"));
    }
  }
  if (absl::GetFlag(FLAGS_num_requests) <= 0 || absl::GetFlag(FLAGS_input_len) <= 0 ||
      absl::GetFlag(FLAGS_output_len) <= 0) {
    return Fail(absl::InvalidArgumentError(
        "--num-requests, --input-len and --output-len must be positive"));
  }
  // The router (for its model's vocabulary, and the requests unless --frontend http).
  std::unique_ptr<v1::Generation::Stub> stub;
  int64_t vocab = absl::GetFlag(FLAGS_vocab_size);
  std::string model_name = "(given by --vocab-size)";
  if (!http_only) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> made = rpc::ChannelFromFlags(server);
    if (!made.ok()) return Fail(made.status());
    std::shared_ptr<grpc::Channel> channel = *std::move(made);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
      return Fail(absl::UnavailableError(absl::StrCat("cannot reach the router at ", server)));
    }
    stub = v1::Generation::NewStub(channel);
    v1::ListModelsResponse models;
    grpc::ClientContext ctx;
    AddApiKey(&ctx);
    rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(10));
    grpc::Status s = stub->ListModels(&ctx, v1::ListModelsRequest(), &models);
    if (!s.ok() || models.models_size() == 0)
      return Fail(absl::UnavailableError("ListModels failed: " + s.error_message()));
    vocab = models.models(0).vocab_size();
    model_name = models.models(0).name();
  }
  // Enough requests for --duration-s at a generous rate; the loop stops at the deadline.
  int n = absl::GetFlag(FLAGS_num_requests);
  if (absl::GetFlag(FLAGS_duration_s) > 0) n = std::max(n, 100000);
  Workload workload(vocab, absl::GetFlag(FLAGS_bench_seed));
  if (absl::Status s = workload.Build(n); !s.ok()) return Fail(s);
  std::fprintf(stderr, "tandem bench: %s, model %s (vocabulary %lld), %zu requests prepared\n",
               http_only ? absl::GetFlag(FLAGS_http_server).c_str() : server.c_str(),
               model_name.c_str(), static_cast<long long>(vocab), workload.prompts().size());

  if (levels.empty()) {
    json r = RunLevel(stub.get(), workload.prompts(), absl::GetFlag(FLAGS_concurrency), rate);
    PrintTable(r);
    if (!absl::GetFlag(FLAGS_json_out).empty())
      std::ofstream(absl::GetFlag(FLAGS_json_out)) << r.dump(2) << "\n";
    return r["completed"].get<int>() > 0 ? 0 : 1;
  }
  std::vector<json> results;
  for (int c : levels) {
    std::fprintf(stderr, "-- concurrency %d\n", c);
    json r = RunLevel(stub.get(), workload.prompts(), c, 0);
    PrintTable(r);
    if (!absl::GetFlag(FLAGS_json_out).empty()) {
      std::ofstream(absl::StrCat(absl::GetFlag(FLAGS_json_out), ".c", c, ".json"))
          << r.dump(2) << "\n";
    }
    results.push_back(std::move(r));
  }
  std::printf("\n%-12s %10s %14s %10s %10s %10s %10s\n", "concurrency", "req/s", "output tok/s",
              "TTFT P50", "TTFT P99", "ITL P50", "ITL P99");
  for (const json& r : results) {
    std::printf("%-12d %10.2f %14.1f %10.1f %10.1f %10.2f %10.2f\n", r["concurrency"].get<int>(),
                r["request_throughput"].get<double>(), r["output_token_throughput"].get<double>(),
                r["ttft"]["p50_ms"].get<double>(), r["ttft"]["p99_ms"].get<double>(),
                r["itl"]["p50_ms"].get<double>(), r["itl"]["p99_ms"].get<double>());
  }
  const std::string chart =
      absl::GetFlag(FLAGS_chart).empty() ? "bench-sweep.svg" : absl::GetFlag(FLAGS_chart);
  std::ofstream(chart) << SweepChart(results);
  std::printf("chart: %s\n", chart.c_str());
  return 0;
}

}  // namespace tandem::cli
