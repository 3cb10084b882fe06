#include "common/serving/worker_host.h"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/backend/create_backend.h"
#include "common/base/logging.h"
#include "common/base/signals.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"
#include "common/model/fingerprint.h"
#include "common/rpc/dtype_proto.h"
#include "common/rpc/server.h"
#include "common/rpc/status.h"
#include "common/rpc/tls.h"
#include "common/serving/engine_flags.h"
#include "common/structured/token_vocabulary.h"
#include "common/transport/kv_data_paths.h"
#include "common/transport/kv_transport.h"
#include "tandem/v1/worker.grpc.pb.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(int32_t, port, 0, "gRPC port (0 = any free port; the chosen one is printed)");
ABSL_FLAG(std::string, bind_address, "0.0.0.0",
          "address the gRPC server (and KV receiver) listen on");
ABSL_FLAG(std::string, advertise_host, "127.0.0.1",
          "host name or IP the router and peers use to reach this worker");
ABSL_FLAG(std::string, router, "",
          "router host:port to register with (empty: the router lists this worker statically)");
ABSL_FLAG(int32_t, heartbeat_interval_ms, 500, "milliseconds between heartbeats to the router");
ABSL_FLAG(double, drain_grace_s, 30, "seconds in-flight requests get to finish after SIGTERM");
ABSL_FLAG(bool, kv_host_staging, false,
          "copy KV layers for transfer through host staging buffers even when the cache is host "
          "memory (what GPU workers always do; for testing that path on the CPU)");
ABSL_FLAG(
    std::string, kv_transport, "tcp",
    "how KV layers travel from prefill to decode workers, a comma-separated list: tcp (inline on "
    "the control connection, from host memory or through host staging), nccl (an NCCL communicator "
    "per prefill-decode pair; GPU workers), cuda-ipc (the decode worker maps the prefill worker's "
    "GPU staging memory; GPU workers on one machine, sharing a GPU or GPUs with peer access). A "
    "prefill worker tries them in order with each decode worker and keeps the first that works; a "
    "decode worker offers every one it names, and tcp always");
ABSL_FLAG(
    std::string, nccl_host_id, "",
    "sets NCCL_HOSTID for this process: give each worker sharing one GPU its own value, or NCCL "
    "refuses the pair (they then talk over NCCL's network transport); leave empty across GPUs");
ABSL_FLAG(int32_t, metrics_port, -1,
          "port of GET /metrics (Prometheus); 0 = any free port (printed), -1 = off");

namespace tandem {

absl::StatusOr<KvDataPaths> KvDataPathsFromFlags(KvCacheStorage* storage) {
  ASSIGN_OR_RETURN(const std::vector<std::string> names,
                   ParseKvTransports(absl::GetFlag(FLAGS_kv_transport)));
  return KvDataPaths::Create(names, storage);
}

namespace {

class StatusService final : public v1::WorkerStatus::CallbackService {
 public:
  StatusService(WorkerService* service, std::atomic<int>* state)
      : service_(service), state_(state) {}
  void set_description(const v1::WorkerDescription& d) {
    absl::MutexLock lock(&mu_);
    description_ = d;
  }
  v1::WorkerInfo Info() const {
    v1::WorkerInfo info;
    {
      absl::MutexLock lock(&mu_);
      *info.mutable_worker() = description_;
    }
    const int state = state_->load();
    info.set_state(state == 0 ? "LOADING" : state == 1 ? "SERVING" : "DRAINING");
    if (state != 0) {
      const EngineSnapshot s = service_->snapshot();
      v1::WorkerLoad* l = info.mutable_load();
      l->set_waiting(s.waiting);
      l->set_running(s.running);
      l->set_free_blocks(s.free_blocks);
      l->set_total_blocks(s.total_blocks);
      l->set_pending_transfers(s.pending_transfers);
      l->set_kv_full(s.kv_full);
    }
    info.mutable_load()->set_draining(state == 2);
    return info;
  }
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest*,
                                      v1::WorkerInfo* response) override {
    *response = Info();
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  WorkerService* service_;
  std::atomic<int>* state_;  // 0 loading, 1 serving, 2 draining
  mutable absl::Mutex mu_;
  v1::WorkerDescription description_ ABSL_GUARDED_BY(mu_);
};

// Registers with the router and heartbeats until `stop`; registers again after NOT_FOUND.
void RegistrationLoop(const std::string& router, const rpc::TlsOptions& tls,
                      const StatusService* status, int interval_ms, absl::Notification* stop) {
  // A router that is starting (or restarting) is reached within a second of listening: reconnects
  // back off from 100 ms to 1 s (gRPC's default grows from 1 s to 2 min), and each call waits for
  // the connection instead of failing while it is retried.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = rpc::CreateTlsChannel(router, tls, args);
  auto stub = v1::Registration::NewStub(channel);
  bool registered = false;
  absl::Time last_warning = absl::InfinitePast();
  while (
      !stop->WaitForNotificationWithTimeout(absl::Milliseconds(registered ? interval_ms : 250))) {
    const v1::WorkerInfo info = status->Info();
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(1));
    ctx.set_wait_for_ready(true);
    grpc::Status s;
    if (!registered) {
      v1::RegisterRequest req;
      *req.mutable_worker() = info.worker();
      v1::RegisterResponse resp;
      s = stub->Register(&ctx, req, &resp);
      if (s.ok()) {
        registered = true;
        TANDEM_LOG(INFO) << "registered with router " << router;
      }
    } else {
      v1::HeartbeatRequest req;
      req.set_address(info.worker().address());
      *req.mutable_load() = info.load();
      v1::HeartbeatResponse resp;
      s = stub->Heartbeat(&ctx, req, &resp);
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) registered = false;  // router restarted
    }
    if (!s.ok() && absl::Now() - last_warning > absl::Seconds(10)) {
      TANDEM_LOG(WARNING) << "router " << router << ": " << s.error_message();
      last_warning = absl::Now();
    }
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      TANDEM_LOG(ERROR) << "router " << router << " refused this worker: " << s.error_message();
    }
  }
}

}  // namespace

int RunWorker(const std::string& name, v1::WorkerRole role, WorkerService* service) {
  InstallTerminationHandlers();

  const std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) {
    std::fprintf(stderr, "tandem-%s: --model DIR is required\n", name.c_str());
    return 2;
  }
  auto engine_options = EngineOptionsFromFlags();
  if (!engine_options.ok()) {
    std::fprintf(stderr, "tandem-%s: %s\n", name.c_str(),
                 std::string(engine_options.status().message()).c_str());
    return 2;
  }
  if (absl::StatusOr<std::vector<std::string>> t =
          ParseKvTransports(absl::GetFlag(FLAGS_kv_transport));
      !t.ok()) {
    std::fprintf(stderr, "tandem-%s: %s\n", name.c_str(),
                 std::string(t.status().message()).c_str());
    return 2;
  }
  // Before any NCCL call: NCCL reads its environment once.
  if (const std::string id = absl::GetFlag(FLAGS_nccl_host_id); !id.empty())
    ::setenv("NCCL_HOSTID", id.c_str(), 1);
  engine_options->scheduler.role = role == v1::WORKER_ROLE_PREFILL  ? SchedulerRole::kPrefill
                                   : role == v1::WORKER_ROLE_DECODE ? SchedulerRole::kDecode
                                                                    : SchedulerRole::kCombined;

  const absl::StatusOr<rpc::TlsOptions> tls = rpc::TlsOptionsFromFlags();
  if (!tls.ok()) {
    std::fprintf(stderr, "tandem-%s: %s\n", name.c_str(),
                 std::string(tls.status().message()).c_str());
    return 2;
  }
  std::atomic<int> state{0};
  StatusService status(service, &state);
  rpc::ServerOptions server_options;
  // A worker's callers are the router (and tools): with a CA, every one shows a certificate.
  server_options.credentials = rpc::ServerCredentials(*tls, rpc::ClientAuth::kRequired);
  server_options.listen_address =
      absl::StrCat(absl::GetFlag(FLAGS_bind_address), ":", absl::GetFlag(FLAGS_port));
  server_options.services = service->grpc_services();
  server_options.services.push_back(&status);
  server_options.health_service_names = service->health_service_names();
  server_options.health_service_names.push_back("tandem.v1.WorkerStatus");
  auto server = rpc::StartServer(server_options);
  if (!server.ok()) {
    std::fprintf(stderr, "tandem-%s: %s\n", name.c_str(),
                 std::string(server.status().message()).c_str());
    return 1;
  }
  const std::string address = absl::StrCat(absl::GetFlag(FLAGS_advertise_host), ":", server->port);
  std::printf("tandem-%s: listening on %s\n", name.c_str(), address.c_str());
  const std::string role_name = role == v1::WORKER_ROLE_PREFILL  ? "prefill"
                                : role == v1::WORKER_ROLE_DECODE ? "decode"
                                                                 : "combined";
  Metrics::Options mo;
  mo.model = ModelDirName(model_dir);
  mo.role = role_name;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    mo.listen_address =
        absl::StrCat(absl::GetFlag(FLAGS_bind_address), ":", absl::GetFlag(FLAGS_metrics_port));
  }
  auto metrics = Metrics::Create(mo);
  if (!metrics.ok()) {
    std::fprintf(stderr, "tandem-%s: %s\n", name.c_str(),
                 std::string(metrics.status().message()).c_str());
    return 1;
  }
  if (!mo.listen_address.empty()) {
    std::printf("tandem-%s: metrics on %s:%d/metrics\n", name.c_str(),
                absl::GetFlag(FLAGS_advertise_host).c_str(), (*metrics)->port());
  }
  std::fflush(stdout);
  WorkerMetrics worker_metrics(metrics->get());

  // Load (health says NOT_SERVING meanwhile).
  const absl::Time t0 = absl::Now();
  auto fail = [&](const absl::Status& s) {
    TANDEM_LOG(ERROR) << name << ": " << s;
    server->server->Shutdown(std::chrono::system_clock::now());
    return 1;
  };
  auto backend_options = BackendOptionsFromFlags();
  if (!backend_options.ok()) return fail(backend_options.status());
  auto backend = CreateBackend(*backend_options);
  if (!backend.ok()) return fail(backend.status());
  auto load_options = ModelLoadOptionsFromFlags();
  if (!load_options.ok()) return fail(load_options.status());
  auto model = LlamaModel::Load(model_dir, backend->get(), *load_options);
  if (!model.ok()) return fail(model.status());
  auto fingerprint = ModelFingerprint(model_dir);
  if (!fingerprint.ok()) return fail(fingerprint.status());
  // KV computed by quantized weights, or from rounded activations, differs: a KV link's two ends
  // must also agree on that.
  std::string kv_fingerprint =
      load_options->quantization == QuantType::kNone
          ? *fingerprint
          : absl::StrCat(*fingerprint, "/", std::string(QuantTypeName(load_options->quantization)));
  if (backend_options->activations == ActivationDType::kInt8) {
    absl::StrAppend(&kv_fingerprint, "/a8");
  } else if (backend_options->activations == ActivationDType::kBF16) {
    absl::StrAppend(&kv_fingerprint, "/abf16");
  }
  // Decoding roles speculate with a draft model when one is named.
  absl::StatusOr<std::unique_ptr<LlamaModel>> draft = std::unique_ptr<LlamaModel>();
  if (role != v1::WORKER_ROLE_PREFILL) draft = DraftModelFromFlags(model_dir, **model);
  if (!draft.ok()) return fail(draft.status());
  engine_options->speculation.draft = draft->get();
  // Structured output matches grammars against the tokens' bytes: the model's tokenizer, when it
  // has one (without it, requests asking for structured output are refused).
  if (absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(model_dir);
      tokenizer.ok()) {
    engine_options->vocabulary =
        structured::TokenVocabulary::FromTokenizer(**tokenizer, (*model)->config().vocab_size);
  } else {
    TANDEM_LOG(WARNING) << name << ": no tokenizer (" << tokenizer.status().message()
                        << "): structured output is refused";
  }
  auto engine = Engine::Create(model->get(), *engine_options);
  if (!engine.ok()) return fail(engine.status());
  const ModelConfig& config = (*model)->config();
  v1::WorkerDescription description;
  description.set_address(address);
  description.set_role(role);
  v1::ModelInfo* info = description.mutable_model();
  info->set_name(model_dir);
  info->set_architecture(config.architecture);
  info->set_fingerprint(*fingerprint);
  info->set_vocab_size(static_cast<int32_t>(config.vocab_size));
  info->set_max_position_embeddings(static_cast<int32_t>(config.max_position_embeddings));
  info->set_weight_dtype(ToProto(config.torch_dtype));
  if (absl::GetFlag(FLAGS_kv_host_staging)) (*engine)->kv_storage()->ForceHostStaging();
  const KvCacheGeometry g = (*engine)->kv_storage()->geometry();
  KvGeometryToProto(g, description.mutable_kv_geometry());
  description.set_total_blocks(g.num_blocks);
  description.set_max_model_len((*engine)->stats().max_model_len);
  (*metrics)->SetBuildInfo((*backend)->name(), (*backend)->device_description());
  if (absl::Status s = service->Start(model->get(), engine->get(), kv_fingerprint, &worker_metrics,
                                      &description);
      !s.ok()) {
    return fail(s);
  }
  (*metrics)->OnRefresh([&] {
    if (state.load() != 0) worker_metrics.Refresh(service->snapshot());
  });
  status.set_description(description);
  state = 1;
  server->SetServing(true);
  TANDEM_LOG(INFO) << name << " serving " << model_dir << " on " << address << " (loaded in "
                   << absl::FormatDuration(absl::Trunc(absl::Now() - t0, absl::Milliseconds(1)))
                   << ")";

  absl::Notification stop_registration;
  std::thread registration;
  if (!absl::GetFlag(FLAGS_router).empty()) {
    registration =
        std::thread(RegistrationLoop, absl::GetFlag(FLAGS_router), *tls, &status,
                    std::max(50, absl::GetFlag(FLAGS_heartbeat_interval_ms)), &stop_registration);
  }

  const int sig = WaitForTerminationSignal();
  TANDEM_LOG(INFO) << name << ": " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining ("
                   << service->in_flight() << " requests in flight)";
  state = 2;
  service->StartDraining();
  server->SetServing(false);
  const absl::Time grace_end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_drain_grace_s));
  while (service->in_flight() > 0 && absl::Now() < grace_end)
    absl::SleepFor(absl::Milliseconds(20));
  if (service->in_flight() > 0) {
    TANDEM_LOG(WARNING) << name << ": grace period over, aborting " << service->in_flight()
                        << " requests";
  }
  stop_registration.Notify();
  if (registration.joinable()) registration.join();
  service->Stop();
  metrics->reset();  // its refresher reads the service and worker_metrics
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  TANDEM_LOG(INFO) << name << ": stopped";
  return 0;
}

}  // namespace tandem
