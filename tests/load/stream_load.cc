// tandem-stream-load: opens many GenerateStream calls to a router at once and holds them to their
// end, with a handful of threads (gRPC callback-API reactors), for the router's many-streams load
// test (scripts/load_streams.py). Prompts are random token ids (seeded), outputs greedy, EOS
// ignored, so every stream streams exactly --max-tokens tokens. Prints one JSON object: streams
// started, finished OK, failed (by status code, with the first messages), the most open at once,
// how many had their first token while the last one was being opened, and the wall time.
//
// usage: tandem-stream-load --server HOST:PORT --streams N [--prompt-tokens 16] [--max-tokens 16]
//        [--vocab 4096] [--channels 8] [--open-rate 0 (per second; 0 = all at once)]
//        [--timeout-s 600]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generation.grpc.pb.h"

ABSL_FLAG(std::string, server, "", "router host:port");
ABSL_FLAG(int32_t, streams, 1000, "GenerateStream calls to open");
ABSL_FLAG(int32_t, prompt_tokens, 16, "random prompt length in tokens");
ABSL_FLAG(int32_t, max_tokens, 16, "output tokens per stream (EOS ignored)");
ABSL_FLAG(int32_t, vocab, 4096, "prompt ids are drawn from [0, vocab)");
ABSL_FLAG(int32_t, channels, 8, "gRPC connections the streams are spread over");
ABSL_FLAG(double, open_rate, 0, "streams opened per second (0: all at once)");
ABSL_FLAG(double, timeout_s, 600, "deadline of each stream, and of the whole run");

namespace {

using tandem::v1::GenerateRequest;
using tandem::v1::GenerateStreamResponse;

struct Totals {
  std::atomic<int64_t> open{0}, peak_open{0}, ok{0}, failed{0}, first_tokens{0}, tokens{0};
  std::atomic<int64_t> remaining{0};
  absl::Mutex mu;
  std::map<std::string, int64_t> errors ABSL_GUARDED_BY(mu);
  std::vector<std::string> messages ABSL_GUARDED_BY(mu);
  absl::Notification all_done;
};

class Stream final : public grpc::ClientReadReactor<GenerateStreamResponse> {
 public:
  Stream(tandem::v1::Generation::Stub* stub, GenerateRequest request, Totals* totals)
      : request_(std::move(request)), totals_(totals) {
    context_.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_timeout_s) * 1e3)));
    const int64_t open = ++totals_->open;
    for (int64_t peak = totals_->peak_open.load();
         open > peak && !totals_->peak_open.compare_exchange_weak(peak, open);) {
    }
    stub->async()->GenerateStream(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

 private:
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (response_.has_delta() && response_.delta().token_ids_size() > 0) {
      if (!first_) {
        first_ = true;
        ++totals_->first_tokens;
      }
      totals_->tokens += response_.delta().token_ids_size();
    }
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    --totals_->open;
    if (status.ok()) {
      ++totals_->ok;
    } else {
      ++totals_->failed;
      absl::MutexLock lock(&totals_->mu);
      ++totals_->errors[absl::StrCat(status.error_code())];
      if (totals_->messages.size() < 5) totals_->messages.push_back(status.error_message());
    }
    if (--totals_->remaining == 0) totals_->all_done.Notify();
    delete this;
  }

  grpc::ClientContext context_;
  GenerateRequest request_;
  GenerateStreamResponse response_;
  Totals* totals_;
  bool first_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string server = absl::GetFlag(FLAGS_server);
  const int n = absl::GetFlag(FLAGS_streams);
  if (server.empty() || n <= 0) {
    std::fprintf(stderr, "tandem-stream-load: give --server HOST:PORT and --streams N > 0\n");
    return 2;
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<tandem::v1::Generation::Stub>> stubs;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_channels)); ++i) {
    grpc::ChannelArguments args;
    args.SetInt("tandem.load_channel", i);  // a distinct connection each
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(64 << 20);
    channels.push_back(grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(tandem::v1::Generation::NewStub(channels.back()));
  }
  for (auto& c : channels) {
    if (!c->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
      std::fprintf(stderr, "tandem-stream-load: cannot connect to %s\n", server.c_str());
      return 1;
    }
  }
  Totals totals;
  totals.remaining = n;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> id(0, absl::GetFlag(FLAGS_vocab) - 1);
  const double rate = absl::GetFlag(FLAGS_open_rate);
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < n; ++i) {
    if (rate > 0) absl::SleepFor(t0 + absl::Seconds(i / rate) - absl::Now());
    GenerateRequest r;
    r.set_request_id(absl::StrCat("load-", i));
    for (int t = 0; t < absl::GetFlag(FLAGS_prompt_tokens); ++t)
      r.mutable_prompt_token_ids()->add_ids(id(rng));
    r.mutable_sampling()->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
    r.mutable_sampling()->set_temperature(0);
    r.mutable_sampling()->set_ignore_eos(true);
    new Stream(stubs[i % stubs.size()].get(), std::move(r), &totals);
  }
  const double open_s = absl::ToDoubleSeconds(absl::Now() - t0);
  const int64_t first_while_opening = totals.first_tokens.load();
  totals.all_done.WaitForNotificationWithTimeout(
      absl::Seconds(absl::GetFlag(FLAGS_timeout_s) + 30));
  nlohmann::json out;
  out["streams"] = n;
  out["ok"] = totals.ok.load();
  out["failed"] = totals.failed.load();
  out["unfinished"] = totals.remaining.load();
  out["peak_open"] = totals.peak_open.load();
  out["first_tokens_while_opening"] = first_while_opening;
  out["tokens"] = totals.tokens.load();
  out["open_s"] = open_s;
  out["wall_s"] = absl::ToDoubleSeconds(absl::Now() - t0);
  {
    absl::MutexLock lock(&totals.mu);
    out["errors_by_code"] = totals.errors;
    out["error_messages"] = totals.messages;
  }
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  // Streams still open (a timeout) would outlive `totals`: leave without unwinding.
  std::_Exit(totals.remaining.load() == 0 && totals.failed.load() == 0 ? 0 : 1);
}
