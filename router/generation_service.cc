#include "router/generation_service.h"

#include <atomic>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/rpc/chat_convert.h"
#include "common/rpc/convert.h"
#include "common/rpc/raw_message.h"
#include "common/rpc/reactors.h"
#include "common/rpc/status.h"
#include "common/rpc/tls.h"
#include "common/structured/structured_output.h"
#include "common/tokenizer/stop_strings.h"

namespace tandem::router {
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, const absl::Status& status) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(rpc::ToGrpc(status));
  return reactor;
}

std::string NewRequestId() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  return absl::StrFormat("req-%08x-%d", salt & 0xffffffff, counter.fetch_add(1));
}

// Streams deltas and the final message to a GenerateStream call.
class StreamSink final : public FlowSink {
 public:
  StreamSink(std::shared_ptr<rpc::ServerStream<grpc::ByteBuffer>> stream, std::string id)
      : stream_(std::move(stream)), id_(std::move(id)) {}
  void Delta(v1::TextDelta delta) override {
    if (delta.text().empty() && delta.token_ids_size() == 0) return;
    v1::GenerateStreamResponse r;
    r.set_request_id(id_);
    *r.mutable_delta() = std::move(delta);
    stream_->Write(rpc::ToByteBuffer(r));
  }
  void Finish(const grpc::Status& status, v1::GenerateResponse final) override {
    if (status.ok()) {
      v1::GenerateStreamResponse r;
      r.set_request_id(id_);
      *r.mutable_final() = std::move(final);
      stream_->Write(rpc::ToByteBuffer(r));
    }
    stream_->Finish(status);
  }

 private:
  std::shared_ptr<rpc::ServerStream<grpc::ByteBuffer>> stream_;
  std::string id_;
};

// Gathers a whole response for the unary Generate.
class UnarySink final : public FlowSink {
 public:
  explicit UnarySink(std::shared_ptr<rpc::UnaryCall<grpc::ByteBuffer>> call)
      : call_(std::move(call)) {}
  void Delta(v1::TextDelta delta) override {
    text_ += delta.text();
    for (int32_t id : delta.token_ids()) ids_.push_back(id);
    for (auto& l : *delta.mutable_logprobs()) logprobs_.push_back(std::move(l));
  }
  void Finish(const grpc::Status& status, v1::GenerateResponse final) override {
    final.set_text(text_);
    *final.mutable_token_ids() = {ids_.begin(), ids_.end()};
    for (auto& l : logprobs_) *final.add_logprobs() = std::move(l);
    const grpc::ByteBuffer bytes = rpc::ToByteBuffer(final);
    call_->Finish(status, &bytes);
  }

 private:
  std::shared_ptr<rpc::UnaryCall<grpc::ByteBuffer>> call_;
  std::string text_;
  std::vector<int32_t> ids_;
  std::vector<v1::PositionLogprobs> logprobs_;
};

// A chat request's output: the generated text parsed for tool calls into the final message, with
// the prompt the conversation became (the raw text stays where it was: streamed, or in the unary
// response).
class ChatSink final : public FlowSink {
 public:
  ChatSink(std::shared_ptr<FlowSink> inner, chat::ToolCallFormat format, std::string request_id,
           std::vector<int32_t> prompt)
      : inner_(std::move(inner)),
        format_(format),
        request_id_(std::move(request_id)),
        prompt_(std::move(prompt)) {}
  void Delta(v1::TextDelta delta) override {
    text_ += delta.text();
    inner_->Delta(std::move(delta));
  }
  void Finish(const grpc::Status& status, v1::GenerateResponse final) override {
    if (status.ok()) {
      *final.mutable_chat() = rpc::ChatOutputFromText(text_, format_, request_id_);
      *final.mutable_prompt_token_ids() = {prompt_.begin(), prompt_.end()};
    }
    inner_->Finish(status, std::move(final));
  }

 private:
  std::shared_ptr<FlowSink> inner_;
  chat::ToolCallFormat format_;
  std::string request_id_;
  std::vector<int32_t> prompt_;
  std::string text_;
};

// Charges a request's generated tokens to its API key when it ends.
class ChargingSink final : public FlowSink {
 public:
  ChargingSink(std::shared_ptr<FlowSink> inner, ApiKeys* keys, std::string key)
      : inner_(std::move(inner)), keys_(keys), key_(std::move(key)) {}
  void Delta(v1::TextDelta delta) override { inner_->Delta(std::move(delta)); }
  void Finish(const grpc::Status& status, v1::GenerateResponse final) override {
    keys_->Charge(key_, final.usage().completion_tokens());
    inner_->Finish(status, std::move(final));
  }

 private:
  std::shared_ptr<FlowSink> inner_;
  ApiKeys* keys_;
  std::string key_;
};

// Observes a flow for the router's metrics, then forwards to the client's sink.
class MeteredSink final : public FlowSink {
 public:
  MeteredSink(std::shared_ptr<FlowSink> inner, RouterMetrics* metrics)
      : inner_(std::move(inner)), metrics_(metrics) {}
  void Delta(v1::TextDelta delta) override {
    if (delta.token_ids_size() > 0) {
      const absl::Time now = absl::Now();
      if (last_ != absl::InfinitePast())
        metrics_->ObserveInterToken(absl::ToDoubleSeconds(now - last_), delta.token_ids_size());
      last_ = now;
    }
    inner_->Delta(std::move(delta));
  }
  void Finish(const grpc::Status& status, v1::GenerateResponse final) override {
    metrics_->Finished(status, final, /*admitted=*/true);
    inner_->Finish(status, std::move(final));
  }

 private:
  std::shared_ptr<FlowSink> inner_;
  RouterMetrics* metrics_;
  absl::Time last_ = absl::InfinitePast();
};

}  // namespace

GenerationService::GenerationService(const Options& options, Cluster* cluster,
                                     const Tokenizer* tokenizer, RouterMetrics* metrics)
    : options_(options),
      cluster_(cluster),
      tokenizer_(tokenizer),
      metrics_(metrics),
      env_{.cluster = cluster,
           .tokenizer = tokenizer,
           .max_migrations = std::max(0, options.max_migrations),
           .eos_token_id = options.eos_token_id,
           .metrics = metrics} {
  watchdog_ = std::thread([this] { Watchdog(); });
}

GenerationService::~GenerationService() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& c : active_) c->Cancel();
    for (const Job& j : queue_) j.control->Cancel();  // they end at once, cancelled
  }
  StartQueued();
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this] { return running_ == 0 && finishing_ == 0 && queue_.empty() && !pumping_; };
    mu_.Await(absl::Condition(&idle));
  }
  watchdog_.join();
}

int64_t GenerationService::in_flight() const {
  absl::MutexLock lock(&mu_);
  return running_ + static_cast<int64_t>(queue_.size());
}

absl::Status GenerationService::Submit(const v1::GenerateRequest& request, absl::Time deadline,
                                       std::shared_ptr<FlowControl> control,
                                       const SinkFactory& make_sink, const std::string& api_key) {
  absl::StatusOr<FlowRequest> r = Validate(request, deadline);
  absl::Status s = r.status();
  if (s.ok() && !api_key.empty() && options_.api_keys != nullptr) {
    s = options_.api_keys->Admit(api_key, static_cast<int64_t>(r->prompt.size()));
    if (!s.ok() && metrics_ != nullptr) metrics_->ApiKeyRefused("rate_limited");
  }
  if (s.ok()) {
    auto flow = std::make_shared<FlowRequest>(*std::move(r));
    std::shared_ptr<FlowSink> sink = make_sink(flow->id);
    if (flow->chat) {
      sink = std::make_shared<ChatSink>(std::move(sink), flow->tool_call_format, flow->id,
                                        flow->prompt);
    }
    if (!api_key.empty() && options_.api_keys != nullptr)
      sink = std::make_shared<ChargingSink>(std::move(sink), options_.api_keys, api_key);
    s = Admit(std::move(flow), std::move(control), std::move(sink), request.priority());
    if (s.ok()) StartQueued();
  }
  if (!s.ok() && metrics_ != nullptr)
    metrics_->Finished(rpc::ToGrpc(s), v1::GenerateResponse(), /*admitted=*/false);
  return s;
}

absl::Status GenerationService::SubmitRequest(const v1::GenerateRequest& request,
                                              absl::Time deadline,
                                              std::shared_ptr<FlowControl> control,
                                              std::shared_ptr<FlowSink> sink,
                                              const std::string& api_key) {
  return Submit(
      request, deadline, std::move(control), [&](const std::string&) { return sink; }, api_key);
}

absl::StatusOr<std::string> GenerationService::Authenticate(std::string_view authorization) {
  if (options_.api_keys == nullptr) return std::string();
  absl::StatusOr<std::string> name = options_.api_keys->Authenticate(authorization);
  if (!name.ok() && metrics_ != nullptr) metrics_->ApiKeyRefused("unauthenticated");
  return name;
}

absl::StatusOr<std::string> GenerationService::AuthenticateCall(
    const grpc::CallbackServerContext& context) {
  if (options_.api_keys == nullptr) return std::string();
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  return Authenticate(it == metadata.end()
                          ? std::string_view()
                          : std::string_view(it->second.data(), it->second.size()));
}

bool GenerationService::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_ || stopping_;
}

void GenerationService::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

absl::Status GenerationService::CheckModel(const std::string& model) const {
  if (model.empty() || model == options_.model.name()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model \"", model, "\"; this router serves \"", options_.model.name(), "\""));
}

absl::StatusOr<std::string> GenerationService::ForcedToolChoice(const v1::ChatInput& chat,
                                                                FlowRequest* r) const {
  const v1::ToolChoice& choice = chat.tool_choice();
  switch (choice.mode()) {
    case v1::ToolChoice::MODE_NONE:
      r->tool_call_format = chat::ToolCallFormat::kNone;
      return std::string();
    case v1::ToolChoice::MODE_REQUIRED:
    case v1::ToolChoice::MODE_FUNCTION: {
      if (choice.mode() == v1::ToolChoice::MODE_FUNCTION && choice.function_name().empty()) {
        return absl::InvalidArgumentError("tool_choice function needs function_name");
      }
      absl::StatusOr<std::string> schema = chat::ForcedToolCallSchema(
          chat.tools_json(),
          choice.mode() == v1::ToolChoice::MODE_FUNCTION ? choice.function_name() : "",
          !choice.has_parallel_tool_calls() || choice.parallel_tool_calls());
      if (!schema.ok()) return schema.status();
      r->tool_call_format = chat::ToolCallFormat::kJsonArray;
      return *std::move(schema);
    }
    default: return std::string();
  }
}

absl::StatusOr<FlowRequest> GenerationService::Validate(const v1::GenerateRequest& req,
                                                        absl::Time deadline) const {
  RETURN_IF_ERROR(CheckModel(req.model()));
  FlowRequest r;
  r.id = req.request_id().empty() ? NewRequestId() : req.request_id();
  if (r.id.size() > 256) return absl::InvalidArgumentError("request_id is longer than 256 bytes");
  for (unsigned char c : r.id) {
    if (c < 0x20 || c == 0x7f)
      return absl::InvalidArgumentError("request_id contains control characters");
  }
  const int64_t vocab = options_.model.vocab_size();
  bool keep_special_tokens = false;
  std::string forced_tool_schema;  // a chat's tool_choice required or named
  switch (req.input_case()) {
    case v1::GenerateRequest::kPrompt:
      if (req.prompt().empty()) return absl::InvalidArgumentError("prompt is empty");
      if (req.prompt().size() > (64u << 20))
        return absl::InvalidArgumentError("prompt is larger than 64 MiB");
      r.prompt = tokenizer_->Encode(req.prompt(), req.add_special_tokens());
      if (r.prompt.empty()) return absl::InvalidArgumentError("prompt encodes to no tokens");
      break;
    case v1::GenerateRequest::kPromptTokenIds:
      if (req.prompt_token_ids().ids_size() == 0)
        return absl::InvalidArgumentError("prompt_token_ids is empty");
      r.prompt.assign(req.prompt_token_ids().ids().begin(), req.prompt_token_ids().ids().end());
      for (size_t i = 0; i < r.prompt.size(); ++i) {
        if (r.prompt[i] < 0 || r.prompt[i] >= vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat("prompt_token_ids[", i, "] = ", r.prompt[i],
                           " is outside the vocabulary [0, ", vocab, ")"));
        }
      }
      break;
    case v1::GenerateRequest::kChat: {
      if (options_.chat_template == nullptr) {
        return absl::InvalidArgumentError(
            "this model has no chat template (no chat_template in tokenizer_config.json, no "
            "chat_template.jinja): send a prompt instead");
      }
      ASSIGN_OR_RETURN(chat::ChatRenderRequest render, rpc::ChatRenderRequestFromProto(req.chat()));
      absl::StatusOr<std::string> text = options_.chat_template->Render(render);
      if (!text.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the chat template: ", text.status().message()));
      }
      if (text->size() > (64u << 20))
        return absl::InvalidArgumentError("the rendered chat is larger than 64 MiB");
      // The template wrote the special tokens (BOS among them), as apply_chat_template assumes.
      r.prompt = tokenizer_->Encode(*text, /*add_special_tokens=*/false);
      if (r.prompt.empty())
        return absl::InvalidArgumentError("the rendered chat encodes to no tokens");
      r.chat = true;
      r.tool_call_format = options_.tool_call_format;
      // Mistral's [TOOL_CALLS] marker is a special token: the parser needs it in the text.
      keep_special_tokens =
          options_.tool_call_format == chat::ToolCallFormat::kMistral && !render.tools.is_null();
      ASSIGN_OR_RETURN(forced_tool_schema, ForcedToolChoice(req.chat(), &r));
      break;
    }
    default: return absl::InvalidArgumentError("give prompt, prompt_token_ids or chat");
  }
  r.params = rpc::FromProto(req.sampling());
  r.proto_params = req.sampling();
  if (!forced_tool_schema.empty()) {
    if (r.params.structured_output.kind != StructuredOutput::Kind::kNone) {
      return absl::InvalidArgumentError(
          "tool_choice required or a named function generates under structured output: "
          "sampling.structured_output cannot be set with it");
    }
    r.params.structured_output.kind = StructuredOutput::Kind::kJsonSchema;
    r.params.structured_output.json_schema = forced_tool_schema;
    r.proto_params.mutable_structured_output()->set_json_schema(forced_tool_schema);
  }
  if (r.params.structured_output.kind != StructuredOutput::Kind::kNone) {
    // Refused here, before any worker sees it, when the grammar cannot express the schema.
    RETURN_IF_ERROR(structured::CompileStructuredOutput(r.params.structured_output).status());
  }
  r.proto_params.clear_stop();
  r.proto_params.clear_skip_special_tokens();
  SamplingLimits limits;
  limits.vocab_size = vocab;
  limits.max_model_len = cluster_->max_model_len() > 0 ? cluster_->max_model_len()
                                                       : options_.model.max_position_embeddings();
  limits.prompt_len = static_cast<int64_t>(r.prompt.size());
  limits.max_logprobs = options_.max_logprobs;
  if (r.chat && !req.sampling().has_max_tokens()) {
    // A chat request without max_tokens may use the rest of the context (as OpenAI's API does).
    r.params.max_tokens =
        static_cast<int32_t>(std::max<int64_t>(0, limits.max_model_len - limits.prompt_len));
    r.proto_params.set_max_tokens(r.params.max_tokens);
  }
  if (limits.prompt_len >= limits.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", limits.prompt_len,
                                                   " tokens; the context holds ",
                                                   limits.max_model_len, " (prompt and output)"));
  }
  RETURN_IF_ERROR(r.params.Validate(limits));
  r.stop.assign(req.sampling().stop().begin(), req.sampling().stop().end());
  RETURN_IF_ERROR(StopStringMatcher::Validate(r.stop));
  r.skip_special_tokens = req.sampling().skip_special_tokens() && !keep_special_tokens;
  r.arrival = absl::Now();
  r.deadline = std::min(deadline, r.arrival + options_.request_timeout);
  if (r.deadline <= r.arrival)
    return absl::DeadlineExceededError("the deadline passed before the request arrived");
  return r;
}

absl::Status GenerationService::Admit(std::shared_ptr<FlowRequest> request,
                                      std::shared_ptr<FlowControl> control,
                                      std::shared_ptr<FlowSink> sink, int32_t priority) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || draining_) return absl::UnavailableError("the router is shutting down");
  const int64_t waiting = static_cast<int64_t>(queue_.size());
  // With a token budget the queue itself is what --max-queued-requests bounds (flows may run far
  // fewer than --max-concurrent-requests).
  if (running_ + waiting >= options_.max_concurrent_requests + options_.max_queued_requests ||
      (options_.max_inflight_tokens > 0 && waiting >= options_.max_queued_requests)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "overloaded: ", running_, " requests running and ", waiting,
        " queued (--max-queued-requests ", options_.max_queued_requests, "); retry later"));
  }
  if (!ids_.insert(request->id).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id \"", request->id, "\" is already in flight"));
  }
  if (metrics_ != nullptr) {
    metrics_->Admitted();
    sink = std::make_shared<MeteredSink>(std::move(sink), metrics_);
  }
  const int64_t tokens =
      static_cast<int64_t>(request->prompt.size()) + std::max(0, request->params.max_tokens);
  Job job{priority, next_order_++, std::move(request), control, std::move(sink), tokens};
  auto pos = std::find_if(queue_.begin(), queue_.end(),
                          [&](const Job& j) { return j.priority < priority; });
  queue_.insert(pos, std::move(job));
  return absl::OkStatus();
}

void GenerationService::StartQueued() {
  {
    absl::MutexLock lock(&mu_);
    if (pumping_) return;  // the thread pumping starts what this call would
    pumping_ = true;
  }
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      // A head cancelled or past its deadline is taken at once (RunJob ends it): it must not hold
      // the queue behind a budget it will never use.
      const bool dead = !queue_.empty() && (queue_.front().control->cancelled() ||
                                            absl::Now() >= queue_.front().request->deadline);
      const bool full = !queue_.empty() && !dead &&
                        (running_ >= std::max(1, options_.max_concurrent_requests) ||
                         (options_.max_inflight_tokens > 0 && running_ > 0 &&
                          running_tokens_ + queue_.front().tokens > options_.max_inflight_tokens));
      if (queue_.empty() || (full && !stopping_)) {
        pumping_ = false;
        return;
      }
      job = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      running_tokens_ += job.tokens;
      active_.insert(job.control);
    }
    RunJob(std::move(job));
  }
}

void GenerationService::RunJob(Job job) {
  auto done = [this, control = job.control, id = job.request->id, tokens = job.tokens] {
    {
      absl::MutexLock lock(&mu_);
      active_.erase(control);
      ids_.erase(id);
      --running_;
      running_tokens_ -= tokens;
      ++finishing_;
    }
    StartQueued();
    absl::MutexLock lock(&mu_);
    --finishing_;
  };
  if (job.control->cancelled()) {
    job.sink->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while queued"), {});
    return done();
  }
  if (absl::Now() >= job.request->deadline) {
    job.sink->Finish(
        grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded while queued"), {});
    return done();
  }
  StartFlow(env_, std::move(job.request), std::move(job.control), std::move(job.sink),
            std::move(done));
}

void GenerationService::Watchdog() {
  while (true) {
    std::vector<std::shared_ptr<FlowControl>> active;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this] { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(100))) return;
      active.assign(active_.begin(), active_.end());
    }
    for (const auto& c : active)
      c->CancelUnhealthy([this](const std::string& w) { return cluster_->IsHealthy(w); });
  }
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::GenerateStream(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  auto control = std::make_shared<FlowControl>();
  std::shared_ptr<rpc::ServerStream<grpc::ByteBuffer>> stream;
  auto* reactor =
      rpc::ServerStream<grpc::ByteBuffer>::Start([control] { control->Cancel(); }, &stream);
  absl::Status s = SubmitRaw(*context, *raw, control, [&](const std::string& id) {
    return std::make_shared<StreamSink>(stream, id);
  });
  if (!s.ok()) stream->Finish(rpc::ToGrpc(s));
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Generate(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* raw,
                                                      grpc::ByteBuffer* response) {
  auto control = std::make_shared<FlowControl>();
  std::shared_ptr<rpc::UnaryCall<grpc::ByteBuffer>> call;
  auto* reactor = rpc::UnaryCall<grpc::ByteBuffer>::Start(
      response, [control] { control->Cancel(); }, &call);
  absl::Status s = SubmitRaw(*context, *raw, control,
                             [&](const std::string&) { return std::make_shared<UnarySink>(call); });
  if (!s.ok()) call->Finish(rpc::ToGrpc(s));
  return reactor;
}

absl::Status GenerationService::SubmitRaw(const grpc::CallbackServerContext& context,
                                          const grpc::ByteBuffer& raw,
                                          std::shared_ptr<FlowControl> control,
                                          const SinkFactory& make_sink) {
  absl::StatusOr<std::string> key = AuthenticateCall(context);
  if (!key.ok()) return key.status();
  v1::GenerateRequest request;
  if (absl::Status s = rpc::ParseRawMessage(raw, &request); !s.ok()) {
    if (metrics_ != nullptr)
      metrics_->Finished(rpc::ToGrpc(s), v1::GenerateResponse(), /*admitted=*/false);
    return s;
  }
  return Submit(request, rpc::DeadlineOf(context), std::move(control), make_sink, *key);
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* raw,
                                                      grpc::ByteBuffer* response) {
  if (absl::StatusOr<std::string> key = AuthenticateCall(*context); !key.ok())
    return Answer(context, key.status());
  v1::TokenizeRequest request;
  if (absl::Status s = rpc::ParseRawMessage(*raw, &request); !s.ok()) return Answer(context, s);
  if (absl::Status s = CheckModel(request.model()); !s.ok()) return Answer(context, s);
  if (request.text().size() > (64u << 20))
    return Answer(context, absl::InvalidArgumentError("text is larger than 64 MiB"));
  v1::TokenizeResponse out;
  for (int32_t id : tokenizer_->Encode(request.text(), request.add_special_tokens()))
    out.add_ids(id);
  *response = rpc::ToByteBuffer(out);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* context,
                                                        const v1::DetokenizeRequest* request,
                                                        v1::DetokenizeResponse* response) {
  if (absl::StatusOr<std::string> key = AuthenticateCall(*context); !key.ok())
    return Answer(context, key.status());
  if (absl::Status s = CheckModel(request->model()); !s.ok()) return Answer(context, s);
  std::vector<int32_t> ids(request->ids().begin(), request->ids().end());
  absl::StatusOr<std::string> text = tokenizer_->Decode(ids, request->skip_special_tokens());
  if (!text.ok()) return Answer(context, absl::InvalidArgumentError(text.status().message()));
  response->set_text(*text);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* GenerationService::ListModels(grpc::CallbackServerContext* context,
                                                        const v1::ListModelsRequest*,
                                                        v1::ListModelsResponse* response) {
  if (absl::StatusOr<std::string> key = AuthenticateCall(*context); !key.ok())
    return Answer(context, key.status());
  *response->add_models() = options_.model;
  return Answer(context, absl::OkStatus());
}

absl::Status RegistrationService::CheckPeer(const grpc::CallbackServerContext& context) const {
  if (!require_client_certificate_ || rpc::PeerAuthenticated(context)) return absl::OkStatus();
  return absl::UnauthenticatedError(
      "registering as a worker needs a client certificate from the cluster's CA (mutual TLS)");
}

grpc::ServerUnaryReactor* RegistrationService::Register(grpc::CallbackServerContext* context,
                                                        const v1::RegisterRequest* request,
                                                        v1::RegisterResponse* response) {
  if (absl::Status s = CheckPeer(*context); !s.ok()) return Answer(context, s);
  response->set_heartbeat_interval_ms(500);
  return Answer(context, cluster_->Register(request->worker()));
}

grpc::ServerUnaryReactor* RegistrationService::Heartbeat(grpc::CallbackServerContext* context,
                                                         const v1::HeartbeatRequest* request,
                                                         v1::HeartbeatResponse*) {
  if (absl::Status s = CheckPeer(*context); !s.ok()) return Answer(context, s);
  return Answer(context, cluster_->Heartbeat(request->address(), request->load()));
}

grpc::ServerUnaryReactor* RegistrationService::ListWorkers(grpc::CallbackServerContext* context,
                                                           const v1::ListWorkersRequest*,
                                                           v1::ListWorkersResponse* response) {
  *response = cluster_->List();
  return Answer(context, absl::OkStatus());
}

}  // namespace tandem::router
