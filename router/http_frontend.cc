#include "router/http_frontend.h"

#include <atomic>
#include <ctime>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/chat/tool_calls.h"
#include "router/openai_api.h"

namespace tandem::router {
namespace {

using openai::Json;

constexpr char kJson[] = "application/json";

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string NewId(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  return absl::StrFormat("%s-%08x%08x", prefix, salt & 0xffffffff, counter.fetch_add(1));
}

// One HTTP request's choices in flight: gathers their outputs and writes the response — whole once
// every choice finished, or streamed as they produce text. Flow threads call in through ChoiceSink;
// everything that reaches the responder is ordered by mu_.
class Exchange : public std::enable_shared_from_this<Exchange> {
  struct ChoiceState {
    openai::ChoiceResult result;
    int64_t text_code_points = 0;
    bool echoed = false;
    std::optional<chat::ToolCallStreamer> streamer;   // chat with tools: content before the calls
    std::vector<v1::PositionLogprobs> held_logprobs;  // logprobs of text held back by the streamer
  };

 public:
  Exchange(openai::ParsedRequest request, std::string endpoint,
           std::shared_ptr<HttpResponder> responder, const Tokenizer* tokenizer,
           RouterMetrics* metrics, chat::ToolCallFormat tool_call_format)
      : request_(std::move(request)),
        endpoint_(std::move(endpoint)),
        responder_(std::move(responder)),
        tokenizer_(tokenizer),
        metrics_(metrics),
        id_(NewId(request_.endpoint == openai::Endpoint::kCompletions ? "cmpl" : "chatcmpl")),
        created_(static_cast<int64_t>(std::time(nullptr))),
        choices_(request_.choices.size()),
        controls_(request_.choices.size()) {
    for (auto& c : controls_) c = std::make_shared<FlowControl>();
    if (request_.stream && request_.parse_tool_calls) {
      for (auto& c : choices_) {
        c.streamer.emplace(request_.forced_tool_calls ? chat::ToolCallFormat::kJsonArray
                                                      : tool_call_format);
      }
    }
  }

  const openai::ParsedRequest& request() const { return request_; }
  const std::string& id() const { return id_; }
  std::shared_ptr<FlowControl> control(size_t i) const { return controls_[i]; }

  void CancelAll() {
    for (auto& c : controls_) c->Cancel();
  }

  // Every choice was admitted: a streamed response begins (with what flows produced meanwhile).
  void Begin(int submitted) {
    absl::MutexLock lock(&mu_);
    pending_ = submitted - finished_;
    if (!request_.stream) {
      MaybeRespondLocked();
      return;
    }
    responder_->StartStream(200, "text/event-stream");
    if (metrics_ != nullptr) metrics_->HttpResponse(endpoint_, 200);
    started_ = true;
    if (request_.endpoint == openai::Endpoint::kChatCompletions) {
      for (size_t i = 0; i < choices_.size(); ++i) {
        Send(openai::ChatChunk(request_, id_, created_, static_cast<int>(i),
                               Json{{"role", "assistant"}, {"content", ""}}, nullptr, ""));
      }
    }
    for (std::string& event : early_) responder_->Write(std::move(event));
    early_.clear();
    MaybeEndStreamLocked();
  }

  // A choice could not be admitted (after `submitted` others were): the whole request fails.
  void Refuse(const absl::Status& status, int submitted) {
    CancelAll();
    absl::MutexLock lock(&mu_);
    refused_ = true;
    pending_ = submitted - finished_;
    if (!error_.has_value()) error_ = status;
    MaybeRespondLocked();
  }

  void Delta(size_t i, v1::TextDelta delta) {
    absl::MutexLock lock(&mu_);
    ChoiceState& c = choices_[i];
    const int64_t offset = c.text_code_points;
    c.result.text += delta.text();
    c.text_code_points += openai::CodePoints(delta.text());
    c.result.token_ids.insert(c.result.token_ids.end(), delta.token_ids().begin(),
                              delta.token_ids().end());
    std::vector<v1::PositionLogprobs> logprobs(delta.logprobs().begin(), delta.logprobs().end());
    if (!request_.stream) {
      for (auto& l : logprobs) c.result.logprobs.push_back(std::move(l));
      return;
    }
    if (delta.text().empty() && logprobs.empty()) return;
    const Json lp = openai::DeltaLogprobs(
        request_, logprobs, *tokenizer_,
        offset + (request_.echo ? openai::CodePoints(request_.echo_text[i]) : 0));
    if (request_.endpoint == openai::Endpoint::kCompletions) {
      std::string text = delta.text();
      if (request_.echo && !c.echoed) {
        text = request_.echo_text[i] + text;
        c.echoed = true;
      }
      Send(openai::CompletionChunk(request_, id_, created_, static_cast<int>(i), text, lp, ""));
    } else if (!c.streamer) {
      Send(openai::ChatChunk(request_, id_, created_, static_cast<int>(i),
                             Json{{"content", delta.text()}}, lp, ""));
    } else {
      // Content goes out as it comes, except what may become a tool call.
      c.held_logprobs.insert(c.held_logprobs.end(), logprobs.begin(), logprobs.end());
      const std::string content = c.streamer->Add(delta.text());
      if (!content.empty()) {
        Send(openai::ChatChunk(
            request_, id_, created_, static_cast<int>(i), Json{{"content", content}},
            openai::DeltaLogprobs(request_, c.held_logprobs, *tokenizer_, 0), ""));
        c.held_logprobs.clear();
      }
    }
  }

  void Finish(size_t i, const grpc::Status& status, v1::GenerateResponse final) {
    absl::MutexLock lock(&mu_);
    ++finished_;
    --pending_;
    if (!status.ok()) {
      if (!error_.has_value())
        error_ = absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                              status.error_message());
      for (auto& c : controls_) c->Cancel();
    } else {
      ChoiceState& c = choices_[i];
      c.result.final = std::move(final);
      if (request_.stream) SendFinalChunks(i);
    }
    if (request_.stream && !refused_) {
      MaybeEndStreamLocked();
    } else {
      MaybeRespondLocked();
    }
  }

 private:
  void Send(const Json& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string data = "data: " + Dump(event) + "\n\n";
    if (started_) {
      responder_->Write(std::move(data));
    } else {
      early_.push_back(std::move(data));
    }
  }

  void SendFinalChunks(size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ChoiceState& c = choices_[i];
    const v1::GenerateResponse& final = c.result.final;
    const int index = static_cast<int>(i);
    if (request_.endpoint == openai::Endpoint::kCompletions) {
      Send(openai::CompletionChunk(request_, id_, created_, index, "", nullptr,
                                   openai::FinishReasonName(final.finish_reason(), false)));
      return;
    }
    const bool tools = request_.parse_tool_calls && final.chat().tool_calls_size() > 0;
    if (c.streamer) {
      // Tool calls are known once the whole text is: they (and content held back) go out now.
      std::string rest;
      c.streamer->Finish(&rest);
      Json delta = Json::object();
      if (!rest.empty()) delta["content"] = rest;
      if (tools) delta["tool_calls"] = openai::ToolCallDelta(final.chat())["tool_calls"];
      if (!delta.empty()) {
        Send(openai::ChatChunk(request_, id_, created_, index, delta,
                               openai::DeltaLogprobs(request_, c.held_logprobs, *tokenizer_, 0),
                               ""));
      }
    }
    Send(openai::ChatChunk(request_, id_, created_, index, Json::object(), nullptr,
                           openai::FinishReasonName(final.finish_reason(), tools)));
  }

  void MaybeEndStreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!started_ || pending_ > 0 || ended_) return;
    ended_ = true;
    if (error_.has_value()) {
      responder_->Write("data: " + openai::ErrorFor(*error_).body + "\n\n");
    } else if (request_.include_usage) {
      int64_t prompt = 0, completion = 0;
      for (size_t i = 0; i < choices_.size(); ++i) {
        if (i % static_cast<size_t>(request_.n) == 0)
          prompt += choices_[i].result.final.usage().prompt_tokens();
        completion += choices_[i].result.final.usage().completion_tokens();
      }
      responder_->Write(
          "data: " + Dump(openai::UsageChunk(request_, id_, created_, prompt, completion)) +
          "\n\n");
    }
    responder_->Write("data: [DONE]\n\n");
    responder_->End();
  }

  void MaybeRespondLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (pending_ > 0 || ended_) return;
    if (request_.stream && !refused_) return;
    ended_ = true;
    if (error_.has_value()) {
      const openai::ApiError e = openai::ErrorFor(*error_);
      if (metrics_ != nullptr) metrics_->HttpResponse(endpoint_, e.http_status);
      responder_->Respond(e.http_status, kJson, e.body);
      return;
    }
    std::vector<openai::ChoiceResult> results;
    for (ChoiceState& c : choices_) results.push_back(std::move(c.result));
    if (metrics_ != nullptr) metrics_->HttpResponse(endpoint_, 200);
    responder_->Respond(
        200, kJson,
        Dump(openai::CompletionResponse(request_, id_, created_, results, *tokenizer_)));
  }

  const openai::ParsedRequest request_;
  const std::string endpoint_;
  const std::shared_ptr<HttpResponder> responder_;
  const Tokenizer* tokenizer_;
  RouterMetrics* metrics_;
  const std::string id_;
  const int64_t created_;
  absl::Mutex mu_;
  std::vector<ChoiceState> choices_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<FlowControl>> controls_;
  int pending_ ABSL_GUARDED_BY(mu_) = 1 << 30;  // set by Begin/Refuse once submission is over
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool refused_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> early_ ABSL_GUARDED_BY(mu_);  // events before the stream's headers
};

class ChoiceSink final : public FlowSink {
 public:
  ChoiceSink(std::shared_ptr<Exchange> exchange, size_t index)
      : exchange_(std::move(exchange)), index_(index) {}
  void Delta(v1::TextDelta delta) override { exchange_->Delta(index_, std::move(delta)); }
  void Finish(const grpc::Status& status, v1::GenerateResponse final) override {
    exchange_->Finish(index_, status, std::move(final));
  }

 private:
  std::shared_ptr<Exchange> exchange_;
  size_t index_;
};

std::string PathOf(const std::string& target) { return target.substr(0, target.find('?')); }

}  // namespace

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(const Options& options,
                                                                  GenerationService* service,
                                                                  Cluster* cluster,
                                                                  const Tokenizer* tokenizer,
                                                                  RouterMetrics* metrics) {
  std::unique_ptr<HttpFrontend> frontend(new HttpFrontend(service, cluster, tokenizer, metrics));
  HttpServer::Options so;
  so.address = options.bind_address;
  so.port = options.port;
  so.threads = options.threads;
  so.max_body_bytes = options.max_body_bytes;
  so.write_through = options.write_through;
  so.tls_cert_file = options.tls_cert_file;
  so.tls_key_file = options.tls_key_file;
  so.tls_refresh = options.tls_refresh;
  HttpFrontend* self = frontend.get();
  auto server = HttpServer::Start(
      so, [self](const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
        self->Handle(request, std::move(responder));
      });
  if (!server.ok()) return server.status();
  frontend->server_ = *std::move(server);
  return frontend;
}

HttpFrontend::~HttpFrontend() {
  if (server_) server_->Stop();
}

void HttpFrontend::Handle(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  const std::string path = PathOf(request.target);
  auto answer = [&](const std::string& endpoint, int status, const std::string& body) {
    if (metrics_ != nullptr) metrics_->HttpResponse(endpoint, status);
    responder->Respond(status, kJson, body);
  };
  auto error = [&](const std::string& endpoint, const absl::Status& status) {
    const openai::ApiError e = openai::ErrorFor(status);
    answer(endpoint, e.http_status, e.body);
  };
  const bool completions = path == "/v1/completions";
  const bool chat = path == "/v1/chat/completions";
  if (path == "/health") {
    const int64_t decoders =
        cluster_->num_live(v1::WORKER_ROLE_DECODE) + cluster_->num_live(v1::WORKER_ROLE_COMBINED);
    if (service_->draining()) return error(path, absl::UnavailableError("the router is draining"));
    if (decoders == 0) return error(path, absl::UnavailableError("no live decode worker"));
    return answer(path, 200, Dump(Json{{"status", "ok"}}));
  }
  // Everything under /v1 needs the caller's API key when the router has a key file.
  absl::StatusOr<std::string> api_key = std::string();
  if (absl::StartsWith(path, "/v1/")) {
    api_key = service_->Authenticate(request.authorization);
    if (!api_key.ok()) return error(path, api_key.status());
  }
  if (path == "/v1/models") {
    if (request.method != "GET")
      return error(path, absl::InvalidArgumentError("use GET for /v1/models"));
    return answer(path, 200,
                  Dump(openai::ModelList(service_->options().model,
                                         static_cast<int64_t>(std::time(nullptr)))));
  }
  if (!completions && !chat) {
    return answer(
        "other", 404,
        openai::ErrorFor(absl::NotFoundError("no such endpoint: " + request.method + " " + path))
            .body);
  }
  if (request.method != "POST")
    return error(path, absl::InvalidArgumentError("use POST for " + path));
  const auto& options = service_->options();
  absl::StatusOr<openai::ParsedRequest> parsed = openai::ParseRequest(
      chat ? openai::Endpoint::kChatCompletions : openai::Endpoint::kCompletions, request.body,
      options.model.name(), options.max_logprobs);
  if (!parsed.ok()) return error(path, parsed.status());
  auto exchange = std::make_shared<Exchange>(*std::move(parsed), path, responder, tokenizer_,
                                             metrics_, options.tool_call_format);
  responder->OnDisconnect([weak = std::weak_ptr<Exchange>(exchange)] {
    if (auto e = weak.lock()) e->CancelAll();
  });
  const auto& choices = exchange->request().choices;
  for (size_t i = 0; i < choices.size(); ++i) {
    v1::GenerateRequest r = choices[i];
    r.set_request_id(absl::StrFormat("%s-%d", exchange->id(), i));
    absl::Status s = service_->SubmitRequest(r, absl::InfiniteFuture(), exchange->control(i),
                                             std::make_shared<ChoiceSink>(exchange, i), *api_key);
    if (!s.ok()) return exchange->Refuse(s, static_cast<int>(i));
  }
  exchange->Begin(static_cast<int>(choices.size()));
}

}  // namespace tandem::router
