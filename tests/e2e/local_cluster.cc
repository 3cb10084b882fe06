#include "tests/e2e/local_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/backend/create_backend.h"
#include "common/rpc/status.h"
#include "gtest/gtest.h"

namespace tandem::e2e {

int FreePort() {
  // Below Linux's ephemeral range (32768 on): a port the kernel hands to a socket that binds port 0
  // (a worker's, another test's outgoing connection) cannot take it between this check and the
  // bind of the process it is for.
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = std::uniform_int_distribution<int>(20000, 32767)(rng);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(port);
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (free) return port;
  }
  ADD_FAILURE() << "no free port between 20000 and 32767";
  return 0;
}

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string Binary(const char* name, const char* built) {
  const std::string dir = Env("TANDEM_E2E_BIN_DIR");
  return dir.empty() ? built : absl::StrCat(dir, "/", name);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> E2eBackend() {
  const std::string device = Env("TANDEM_E2E_DEVICE");
  if (device.empty() || device == "cpu") return CreateBackend({.device = "cpu"});
  return CreateBackend({.device = device, .batch_invariant = true});
}

LocalCluster::LocalCluster(ClusterOptions options) : options_(std::move(options)) {
  static int counter = 0;
  dir_ = absl::StrCat(::testing::TempDir(), "/cluster_", ::getpid(), "_", counter++);
  std::filesystem::create_directories(dir_);
}

LocalCluster::~LocalCluster() {
  for (Proc& w : workers_) w.process->Stop(absl::Seconds(5));
  // An open client connection holds the router's shutdown until its grace period ends.
  generation_.reset();
  registration_.reset();
  if (router_) router_->Stop(absl::Seconds(5));
  if (!::testing::Test::HasFailure()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

absl::Status LocalCluster::Start() {
  const int port = FreePort();
  router_address_ = absl::StrCat("127.0.0.1:", port);
  std::vector<std::string> argv = {Binary("tandem-router", TANDEM_ROUTER_BIN),
                                   "--model=" + options_.model_dir, absl::StrCat("--port=", port),
                                   "--bind-address=127.0.0.1"};
  if (options_.static_workers) {
    for (int i = 0; i < options_.prefill; ++i) {
      if (auto w = SpawnWorker("prefill"); !w.ok()) return w.status();
    }
    for (int i = 0; i < options_.decode; ++i) {
      if (auto w = SpawnWorker("decode"); !w.ok()) return w.status();
    }
    std::string list;
    for (const Proc& w : workers_) list += (list.empty() ? "" : ",") + w.address;
    argv.push_back("--workers=" + list);
  }
  argv.insert(argv.end(), options_.router_args.begin(), options_.router_args.end());
  auto router = Subprocess::Spawn(argv, dir_ + "/router.log");
  if (!router.ok()) return router.status();
  router_ = std::make_unique<Subprocess>(*std::move(router));
  // Connect once it listens: a channel whose first attempt was refused backs off for seconds.
  for (const absl::Time end = absl::Now() + absl::Seconds(30);
       ReadFileFrom(dir_ + "/router.log").find("listening on") == std::string::npos;) {
    if (!router_->running() || absl::Now() > end) {
      return absl::InternalError("the router did not start:\n" +
                                 ReadFileFrom(dir_ + "/router.log"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  auto channel = rpc::CreateTlsChannel(router_address_, options_.tls, args);
  generation_ = v1::Generation::NewStub(channel);
  registration_ = v1::Registration::NewStub(channel);
  for (int i = 0; i < options_.prefill && !options_.static_workers; ++i) {
    if (auto w = SpawnWorker("prefill"); !w.ok()) return w.status();
  }
  for (int i = 0; i < options_.decode && !options_.static_workers; ++i) {
    if (auto w = SpawnWorker("decode"); !w.ok()) return w.status();
  }
  for (int i = 0; i < options_.combined; ++i) {
    if (auto w = SpawnWorker("combined"); !w.ok()) return w.status();
  }
  return WaitLive(workers_.size(), absl::Seconds(60));
}

absl::StatusOr<std::string> LocalCluster::AddWorker(const std::string& role,
                                                    const std::vector<std::string>& extra_args) {
  auto address = SpawnWorker(role, extra_args);
  if (!address.ok()) return address.status();
  // Until the router lists this one (others may come and go meanwhile).
  const Proc& w = workers_.back();
  for (const absl::Time end = absl::Now() + absl::Seconds(30);;) {
    const std::vector<std::string> live = Live();
    if (std::find(live.begin(), live.end(), *address) != live.end()) return address;
    if (!w.process->running()) {
      return absl::InternalError(
          absl::StrCat(role, " worker exited during start-up:\n", ReadFileFrom(w.log)));
    }
    if (absl::Now() > end) {
      return absl::DeadlineExceededError(absl::StrCat(role, " worker ", *address,
                                                      " not live in time; router log:\n",
                                                      ReadFileFrom(dir_ + "/router.log")));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::StatusOr<std::string> LocalCluster::SpawnWorker(const std::string& role,
                                                      const std::vector<std::string>& extra_args) {
  const int port = FreePort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::vector<std::string> argv = {role == "prefill"
                                       ? Binary("tandem-prefill-worker", TANDEM_PREFILL_WORKER_BIN)
                                       : Binary("tandem-decode-worker", TANDEM_DECODE_WORKER_BIN),
                                   "--model=" + options_.model_dir, absl::StrCat("--port=", port),
                                   "--bind-address=127.0.0.1", "--heartbeat-interval-ms=200"};
  if (!options_.static_workers) argv.push_back("--router=" + router_address_);
  if (role == "combined") argv.push_back("--combined");
  if (const std::string device = Env("TANDEM_E2E_DEVICE"); !device.empty()) {
    argv.push_back("--device=" + device);
    argv.push_back("--batch-invariant=true");
    argv.push_back("--gpu-memory-utilization=0.15");  // up to 5 workers share the GPU
  }
  if (const std::string transport = Env("TANDEM_E2E_KV_TRANSPORT"); !transport.empty()) {
    argv.push_back("--kv-transport=" + transport);
    if (transport == "nccl") {
      argv.push_back(absl::StrCat("--nccl-host-id=e2e-", ::getpid(), "-", next_));
      ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);  // the workers, all on this machine, inherit it
    }
  }
  for (absl::string_view a :
       absl::StrSplit(Env(role == "prefill" ? "TANDEM_E2E_PREFILL_ARGS" : "TANDEM_E2E_DECODE_ARGS"),
                      ' ', absl::SkipEmpty())) {
    argv.emplace_back(a);
  }
  argv.insert(argv.end(), options_.worker_args.begin(), options_.worker_args.end());
  if (role == "prefill")
    argv.insert(argv.end(), options_.prefill_args.begin(), options_.prefill_args.end());
  if (role != "prefill")
    argv.insert(argv.end(), options_.decode_args.begin(), options_.decode_args.end());
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  const std::string log = absl::StrCat(dir_, "/", role, "-", next_++, ".log");
  auto p = Subprocess::Spawn(argv, log);
  if (!p.ok()) return p.status();
  workers_.push_back({role, address, log, std::make_unique<Subprocess>(*std::move(p))});
  return address;
}

absl::Status LocalCluster::WaitLive(size_t n, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (Live().size() >= n) return absl::OkStatus();
    for (Proc& w : workers_) {
      if (!w.process->running() && w.process->pid() > 0 && Live().size() < n) {
        return absl::InternalError(
            absl::StrCat(w.role, " worker exited during start-up:\n", ReadFileFrom(w.log)));
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("workers not live in time; router log:\n", ReadFileFrom(dir_ + "/router.log")));
}

std::vector<std::string> LocalCluster::workers(const std::string& role) const {
  std::vector<std::string> out;
  for (const Proc& w : workers_) {
    if (w.role == role) out.push_back(w.address);
  }
  return out;
}

Subprocess* LocalCluster::process(const std::string& address) {
  for (Proc& w : workers_) {
    if (w.address == address) return w.process.get();
  }
  return nullptr;
}

std::string LocalCluster::Log(const std::string& address) const {
  for (const Proc& w : workers_) {
    if (w.address == address) return ReadFileFrom(w.log);
  }
  return ReadFileFrom(dir_ + "/router.log");
}

absl::StatusOr<v1::WorkerInfo> LocalCluster::Status(const std::string& address) {
  auto stub = v1::WorkerStatus::NewStub(rpc::CreateTlsChannel(address, options_.tls));
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(2));
  v1::WorkerInfo info;
  grpc::Status s = stub->GetStatus(&ctx, v1::GetStatusRequest(), &info);
  if (!s.ok()) return rpc::FromGrpc(s);
  return info;
}

bool LocalCluster::WaitIdle(absl::Duration timeout, std::string* why) {
  const absl::Time end = absl::Now() + timeout;
  std::string last;
  do {
    last.clear();
    for (Proc& w : workers_) {
      if (!w.process->running()) continue;
      auto info = Status(w.address);
      if (!info.ok()) {
        last += absl::StrCat(w.address, ": ", info.status().message(), "; ");
        continue;
      }
      const v1::WorkerLoad& l = info->load();
      if (l.free_blocks() != l.total_blocks() || l.running() != 0 || l.waiting() != 0 ||
          l.pending_transfers() != 0) {
        last += absl::StrCat(w.role, " ", w.address, ": free ", l.free_blocks(), "/",
                             l.total_blocks(), " running ", l.running(), " waiting ", l.waiting(),
                             " transfers ", l.pending_transfers(), "; ");
      }
    }
    if (last.empty()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < end);
  if (why != nullptr) *why = last;
  return false;
}

std::vector<std::string> LocalCluster::Live() {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(1));
  v1::ListWorkersResponse r;
  if (!registration_->ListWorkers(&ctx, v1::ListWorkersRequest(), &r).ok()) return {};
  return {r.live().begin(), r.live().end()};
}

}  // namespace tandem::e2e
