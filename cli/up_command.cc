// `tandem up`: a whole cluster on this machine — a router and N prefill and M decode workers (or K
// combined workers) — started as child processes, waited on until every worker serves, printed, and
// shut down cleanly (SIGTERM, drain, then SIGKILL after a grace period) on Ctrl-C or SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "cli/presets.h"
#include "cli/random_model.h"
#include "common/base/signals.h"
#include "common/base/subprocess.h"
#include "common/rpc/status.h"
#include "common/rpc/tls.h"
#include "common/serving/engine_flags.h"
#include "common/transport/kv_data_paths.h"
#include "grpcpp/grpcpp.h"
#include "tandem/v1/worker.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int64_t, max_queued_requests);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(double, gpu_memory_utilization);
ABSL_FLAG(int32_t, prefill, 1, "up: prefill workers to start");
ABSL_FLAG(int32_t, decode, 1, "up: decode workers to start");
ABSL_FLAG(int32_t, combined, 0, "up: combined (prefill + decode, no transfer) workers to start");
ABSL_FLAG(int32_t, port, 50051, "up: the router's gRPC port");
ABSL_FLAG(std::string, log_dir, "",
          "up: directory for the processes' logs (default: a new one under /tmp)");
ABSL_FLAG(std::string, ready_file, "",
          "up: once every worker serves, write the router's address to this file");
ABSL_FLAG(int32_t, metrics_port, -1,
          "up: serve GET /metrics: the router on this port, the workers on the ports after it (-1 "
          "= off)");
ABSL_FLAG(std::string, prometheus_targets, "",
          "up: with --metrics-port, write every process's /metrics address to this file in "
          "Prometheus file_sd format (deploy/prometheus/prometheus.yml reads targets/*.json)");
ABSL_FLAG(double, start_timeout_s, 120, "up: seconds to wait for every worker to serve");
ABSL_FLAG(std::string, kv_transport, "",
          "up: how KV layers travel from prefill to decode workers: tcp, nccl or cuda-ipc, or a "
          "comma-separated list tried in order (the workers' flag). Default: cuda-ipc,tcp with a "
          "GPU --device (the decode worker maps the prefill worker's GPU staging, at device "
          "bandwidth on one GPU; inline TCP where that fails), tcp otherwise. With nccl and every "
          "worker on one device, each worker gets its own --nccl-host-id, which NCCL needs to pair "
          "two processes on one GPU (through its socket transport)");
ABSL_FLAG(
    std::vector<std::string>, worker_args, {},
    "up: extra flags for every worker, comma-separated (e.g. --worker-args=--drain-grace-s=5)");
ABSL_FLAG(
    std::vector<std::string>, prefill_worker_args, {},
    "up: extra flags for prefill workers (e.g. --prefill-worker-args=--layerwise-transfer=false)");
ABSL_FLAG(
    int32_t, http_port, -1,
    "up: serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions) on this "
    "port (-1 = off)");
ABSL_FLAG(std::vector<std::string>, router_args, {},
          "up: extra flags for the router, comma-separated (e.g. "
          "--router-args=--tool-call-parser=hermes)");
ABSL_FLAG(std::vector<std::string>, decode_worker_args, {},
          "up: extra flags for decode and combined workers (e.g. "
          "--decode-worker-args=--kv-transfer-timeout-s=10)");

namespace tandem::cli {
namespace {

std::string FindBinary(const std::string& name, const std::string& subdir) {
  const std::string here = ExecutableDir();
  for (const std::string& p : {here + "/" + name, here + "/../" + subdir + "/" + name}) {
    if (::access(p.c_str(), X_OK) == 0) return std::filesystem::weakly_canonical(p).string();
  }
  return here + "/" + name;
}

// The embedded default model: $TANDEM_DEFAULT_MODEL, else the trained kjv-target shipped in the
// repository's models/ (from the working directory or the source tree this binary was built from),
// else a random tiny Llama written on first use.
absl::StatusOr<std::string> DefaultModel() {
  if (const char* env = std::getenv("TANDEM_DEFAULT_MODEL")) return std::string(env);
  for (const std::string& d :
       {std::string("models/kjv-target"), std::string(TANDEM_SOURCE_DIR) + "/models/kjv-target"}) {
    if (std::filesystem::exists(d + "/config.json")) return d;
  }
  const std::string dir = "models-cache/tiny-llama";
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  std::fprintf(stderr, "tandem up: writing the default model to %s\n", dir.c_str());
  RandomModelOptions o;
  auto preset = FindModelPreset("tiny-llama");
  if (!preset.ok()) return preset.status();
  o.config = preset->config;
  o.out_dir = dir;
  o.seed = 0;
  if (absl::Status s = WriteRandomModel(o); !s.ok()) return s;
  return dir;
}

}  // namespace

int UpCommand() {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "tandem up: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  };
  const int n_prefill = absl::GetFlag(FLAGS_prefill), n_decode = absl::GetFlag(FLAGS_decode),
            n_combined = absl::GetFlag(FLAGS_combined);
  if (n_prefill < 0 || n_decode < 0 || n_combined < 0 || n_prefill > 64 || n_decode > 64 ||
      n_combined > 64) {
    return fail(
        absl::InvalidArgumentError("--prefill, --decode and --combined must be in [0, 64]"));
  }
  if ((n_prefill > 0) != (n_decode > 0)) {
    return fail(absl::InvalidArgumentError(
        "prefill and decode workers come together (--prefill N --decode M, both > 0)"));
  }
  if (n_prefill + n_combined == 0) return fail(absl::InvalidArgumentError("no workers to start"));
  if (auto o = EngineOptionsFromFlags(); !o.ok()) return fail(o.status());
  std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) {
    auto m = DefaultModel();
    if (!m.ok()) return fail(m.status());
    model = *m;
  }
  if (!std::filesystem::exists(model + "/config.json")) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(model, " is not a model directory (no config.json)")));
  }
  std::string log_dir = absl::GetFlag(FLAGS_log_dir);
  if (log_dir.empty()) log_dir = absl::StrCat("/tmp/tandem-up-", ::getpid());
  std::filesystem::create_directories(log_dir);
  const int port = absl::GetFlag(FLAGS_port);
  if (port < 1 ||
      port > 65535) {  // the workers are told the router's port before it binds: 0 cannot be told
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--port must be a port number from 1 to 65535, not ", port)));
  }
  const std::string router_address = absl::StrCat("127.0.0.1:", port);
  // Every worker here shares one machine: on a GPU, CUDA IPC is the fast path between them.
  const std::string kv_transport = !absl::GetFlag(FLAGS_kv_transport).empty()
                                       ? absl::GetFlag(FLAGS_kv_transport)
                                   : absl::GetFlag(FLAGS_device) == "cpu" ? "tcp"
                                                                          : "cuda-ipc,tcp";
  const absl::StatusOr<std::vector<std::string>> kv_paths = ParseKvTransports(kv_transport);
  if (!kv_paths.ok()) return fail(kv_paths.status());

  struct Child {
    std::string name, log;
    std::unique_ptr<Subprocess> process;
  };
  std::vector<Child> children;
  auto stop_all = [&] {
    for (auto it = children.rbegin(); it != children.rend(); ++it) it->process->Signal(SIGTERM);
    for (auto it = children.rbegin(); it != children.rend(); ++it)
      it->process->Stop(absl::Seconds(10));
  };
  auto spawn = [&](const std::string& name, std::vector<std::string> argv) -> absl::Status {
    const std::string log = absl::StrCat(log_dir, "/", name, ".log");
    auto p = Subprocess::Spawn(argv, log);
    if (!p.ok()) return p.status();
    children.push_back({name, log, std::make_unique<Subprocess>(*std::move(p))});
    return absl::OkStatus();
  };
  InstallTerminationHandlers();  // Ctrl-C: stop in order; a second Ctrl-C: exit at once

  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  int next_metrics_port = metrics_port;
  std::vector<std::pair<std::string, std::string>> metrics_targets;  // component, host:port
  auto metrics_arg = [&](const std::string& component) -> std::vector<std::string> {
    if (metrics_port < 0) return {};
    metrics_targets.emplace_back(component, absl::StrCat("127.0.0.1:", next_metrics_port));
    return {absl::StrCat("--metrics-port=", next_metrics_port++)};
  };
  const absl::StatusOr<rpc::TlsOptions> tls = rpc::TlsOptionsFromFlags();
  if (!tls.ok()) return fail(tls.status());
  std::vector<std::string> router_argv = {
      FindBinary("tandem-router", "router"), "--model=" + model, absl::StrCat("--port=", port),
      absl::StrCat("--max-queued-requests=", absl::GetFlag(FLAGS_max_queued_requests))};
  for (const std::string& a : metrics_arg("router")) router_argv.push_back(a);
  const int32_t http_port = absl::GetFlag(FLAGS_http_port);
  if (http_port >= 0) router_argv.push_back(absl::StrCat("--http-port=", http_port));
  for (const std::string& a : rpc::TlsFlagArguments(*tls)) router_argv.push_back(a);
  for (const std::string& a : absl::GetFlag(FLAGS_router_args)) router_argv.push_back(a);
  if (absl::Status s = spawn("router", router_argv); !s.ok()) return fail(s);
  std::vector<std::string> common = {"--model=" + model, "--router=" + router_address, "--port=0"};
  for (const std::string& a : EngineFlagArguments()) common.push_back(a);
  for (const std::string& a : rpc::TlsFlagArguments(*tls)) common.push_back(a);
  common.push_back("--kv-transport=" + kv_transport);
  // Every worker shares the one --device: left at its default, the memory share is split between
  // them (each worker plans its KV pool from its own share).
  const int n_workers = n_prefill + n_decode + n_combined;
  if (absl::GetFlag(FLAGS_device) != "cpu" && n_workers > 1 &&
      absl::GetFlag(FLAGS_gpu_memory_utilization) == 0.9) {
    common.push_back(absl::StrCat("--gpu-memory-utilization=", 0.9 / n_workers));
  }
  // Every worker here runs on the one --device: NCCL pairs two processes on one GPU only when they
  // claim different hosts (common/transport/nccl/nccl_kv_link.h).
  const bool distinct_nccl_hosts =
      std::find(kv_paths->begin(), kv_paths->end(), "nccl") != kv_paths->end() &&
      std::getenv("NCCL_HOSTID") == nullptr;
  // Pairs that claim different hosts talk through NCCL's socket transport: here, over loopback
  // (NCCL skips `lo` unless told, and a machine may have no other interface up). The workers
  // inherit it.
  if (distinct_nccl_hosts) ::setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
  for (const std::string& a : absl::GetFlag(FLAGS_worker_args)) common.push_back(a);
  auto start_workers = [&](int n, const std::string& role, const std::string& binary,
                           const std::string& subdir,
                           std::vector<std::string> extra) -> absl::Status {
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> argv = {FindBinary(binary, subdir)};
      argv.insert(argv.end(), common.begin(), common.end());
      if (distinct_nccl_hosts)
        argv.push_back(absl::StrCat("--nccl-host-id=tandem-up-", ::getpid(), "-", role, "-", i));
      argv.insert(argv.end(), extra.begin(), extra.end());
      for (const std::string& a : metrics_arg(role)) argv.push_back(a);
      if (absl::Status s = spawn(absl::StrCat(role, "-", i), argv); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  const std::vector<std::string> prefill_args = absl::GetFlag(FLAGS_prefill_worker_args);
  std::vector<std::string> decode_args = absl::GetFlag(FLAGS_decode_worker_args);
  absl::Status started =
      start_workers(n_prefill, "prefill", "tandem-prefill-worker", "prefill_worker", prefill_args);
  if (started.ok())
    started =
        start_workers(n_decode, "decode", "tandem-decode-worker", "decode_worker", decode_args);
  decode_args.push_back("--combined");
  if (started.ok())
    started =
        start_workers(n_combined, "combined", "tandem-decode-worker", "decode_worker", decode_args);
  if (!started.ok()) {
    stop_all();
    return fail(started);
  }

  // Wait until the router lists every worker as live. The first attempts are refused until the
  // router listens: reconnect within 100-200 ms, and each call waits for the connection (without
  // both, start-up took ~5 s past the moment the workers were live).
  grpc::ChannelArguments backoff;
  backoff.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  backoff.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  auto stub = v1::Registration::NewStub(rpc::CreateTlsChannel(router_address, *tls, backoff));
  const int expected = n_prefill + n_decode + n_combined;
  const absl::Time give_up = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_start_timeout_s));
  v1::ListWorkersResponse workers;
  while (true) {
    for (Child& c : children) {
      if (!c.process->running()) {
        std::fprintf(stderr, "tandem up: %s exited during start-up; its log (%s):\n%s\n",
                     c.name.c_str(), c.log.c_str(), ReadFileFrom(c.log).c_str());
        stop_all();
        return 1;
      }
    }
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(1));
    ctx.set_wait_for_ready(true);  // through the reconnects while the router starts
    if (stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok() &&
        workers.live_size() >= expected)
      break;
    if (TerminationRequested() || absl::Now() > give_up) {
      std::fprintf(stderr, "tandem up: %s; logs in %s\n",
                   TerminationRequested() ? "interrupted" : "workers did not all start in time",
                   log_dir.c_str());
      stop_all();
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::printf("Tandem cluster serving %s\n", model.c_str());
  std::printf("  router    %-22s pid %-8d log %s\n", router_address.c_str(),
              children[0].process->pid(), children[0].log.c_str());
  for (const v1::WorkerInfo& w : workers.workers()) {
    std::string role =
        v1::WorkerRole_Name(w.worker().role()).substr(std::string("WORKER_ROLE_").size());
    for (char& ch : role) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    std::printf(
        "  %-9s %-22s %s\n", role.c_str(), w.worker().address().c_str(),
        w.worker().kv_address().empty() ? "" : ("KV receiver " + w.worker().kv_address()).c_str());
  }
  if (http_port > 0) {
    // HTTPS when the router has a certificate (its --http-tls, on unless --router-args turn it
    // off).
    bool https = tls->server_tls();
    for (const std::string& a : absl::GetFlag(FLAGS_router_args))
      if (a == "--http-tls=false" || a == "--nohttp_tls" || a == "--nohttp-tls") https = false;
    std::printf("  HTTP API  %s://127.0.0.1:%d/v1 (OpenAI-compatible)\n", https ? "https" : "http",
                http_port);
  }
  std::printf(
      "Stream a completion:  tandem generate --server %s --prompt \"Hello\"\nCtrl-C stops the "
      "cluster.\n",
      router_address.c_str());
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_prometheus_targets).empty() && !metrics_targets.empty()) {
    // [{"targets": ["127.0.0.1:9400"], "labels": {"component": "router"}}, ...]
    std::string text = "[\n";
    for (size_t i = 0; i < metrics_targets.size(); ++i) {
      const auto& [component, target] = metrics_targets[i];
      absl::StrAppend(&text, "  {\"targets\": [\"", target, "\"], \"labels\": {\"component\": \"",
                      component, "\"}}", i + 1 < metrics_targets.size() ? ",\n" : "\n");
    }
    text += "]\n";
    const std::string path = absl::GetFlag(FLAGS_prometheus_targets);
    if (FILE* f = std::fopen((path + ".tmp").c_str(), "w")) {
      std::fputs(text.c_str(), f);
      std::fclose(f);
      std::filesystem::rename(path + ".tmp", path);
    }
  }
  if (metrics_port >= 0) {
    std::printf("Metrics: GET /metrics on ports %d-%d\n", metrics_port, next_metrics_port - 1);
  }
  // Whoever reads the log while the cluster runs (stdout redirected: fully buffered) sees the
  // endpoints now.
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_ready_file).empty()) {
    const std::string tmp = absl::GetFlag(FLAGS_ready_file) + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%s\n", router_address.c_str());
      std::fclose(f);
      std::filesystem::rename(tmp, absl::GetFlag(FLAGS_ready_file));
    }
  }
  while (!TerminationRequested()) {
    for (Child& c : children) {
      if (c.process->running()) continue;
      std::fprintf(stderr, "tandem up: %s exited unexpectedly (log %s)\n", c.name.c_str(),
                   c.log.c_str());
    }
    std::erase_if(children, [](Child& c) { return !c.process->running(); });
    if (children.empty()) return 1;
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::fprintf(stderr, "tandem up: stopping (workers drain first)\n");
  stop_all();
  return 0;
}

}  // namespace tandem::cli
