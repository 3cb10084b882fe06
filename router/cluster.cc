#include "router/cluster.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/rpc/dtype_proto.h"
#include "common/rpc/status.h"
#include "router/dns_resolver.h"

namespace tandem::router {
namespace {

WorkerRole RoleOf(v1::WorkerRole r) {
  switch (r) {
    case v1::WORKER_ROLE_PREFILL: return WorkerRole::kPrefill;
    case v1::WORKER_ROLE_DECODE: return WorkerRole::kDecode;
    default: return WorkerRole::kCombined;
  }
}

}  // namespace

Cluster::Cluster(const Options& options)
    : options_(options),
      registry_({options.model_fingerprint, options.heartbeat_timeout, [] { return absl::Now(); }}),
      prefill_policy_(options.prefill_policy) {
  if (!options_.static_workers.empty() || !options_.dns_workers.empty()) {
    poller_ = std::thread([this] { PollWorkers(); });
  }
}

Cluster::~Cluster() {
  stop_.Notify();
  if (poller_.joinable()) poller_.join();
}

absl::Status Cluster::Register(const v1::WorkerDescription& w) {
  if (w.role() == v1::WORKER_ROLE_UNSPECIFIED)
    return absl::InvalidArgumentError("worker role is unspecified");
  if (w.role() == v1::WORKER_ROLE_DECODE && w.kv_address().empty()) {
    return absl::InvalidArgumentError("a decode worker registers with its KV receiver address");
  }
  WorkerRegistration r;
  r.address = w.address();
  r.role = RoleOf(w.role());
  r.model_fingerprint = w.model().fingerprint();
  r.num_layers = w.kv_geometry().num_layers();
  r.num_kv_heads = w.kv_geometry().num_kv_heads();
  r.head_dim = w.kv_geometry().head_dim();
  r.block_size = w.kv_geometry().block_size();
  // A worker from before 16-bit caches names no dtype: f32.
  r.kv_dtype = std::string(DTypeName(KvDTypeFromProto(w.kv_geometry()).value_or(DType::kF32)));
  r.total_blocks = w.total_blocks();
  RETURN_IF_ERROR(registry_.Register(r));
  absl::MutexLock lock(&mu_);
  const bool known = descriptions_.contains(w.address());
  descriptions_[w.address()] = w;
  if (!known) {
    TANDEM_LOG(INFO) << "worker " << w.address() << " registered (" << v1::WorkerRole_Name(w.role())
                     << ", " << w.total_blocks() << " KV blocks)";
  }
  return absl::OkStatus();
}

absl::Status Cluster::Heartbeat(const std::string& address, const v1::WorkerLoad& load) {
  router::Heartbeat h;
  h.waiting = load.waiting();
  h.running = load.running();
  h.free_blocks = load.free_blocks();
  h.draining = load.draining();
  h.kv_full = load.kv_full();
  RETURN_IF_ERROR(registry_.Heartbeat(address, h));
  absl::MutexLock lock(&mu_);
  loads_[address] = load;
  accounting_[address].blocks_since_heartbeat = 0;
  return absl::OkStatus();
}

Cluster::Assignment::Assignment(Cluster* cluster, std::string address, int64_t blocks)
    : cluster_(cluster), address_(std::move(address)) {
  absl::MutexLock lock(&cluster_->mu_);
  Accounting& a = cluster_->accounting_[address_];
  ++a.active;
  a.blocks_since_heartbeat += blocks;
}

Cluster::Assignment::~Assignment() {
  absl::MutexLock lock(&cluster_->mu_);
  --cluster_->accounting_[address_].active;
}

void Cluster::MarkUnhealthy(const std::string& address) {
  if (IsHealthy(address)) TANDEM_LOG(WARNING) << "worker " << address << " marked unhealthy";
  registry_.MarkUnhealthy(address);
}

void Cluster::Heard(const std::string& address) { registry_.Heard(address); }

bool Cluster::IsHealthy(const std::string& address) const { return registry_.IsHealthy(address); }

std::vector<WorkerLoad> Cluster::Live(v1::WorkerRole role,
                                      const absl::flat_hash_set<std::string>& exclude) const {
  std::vector<WorkerLoad> out;
  const WorkerRole r = role == v1::WORKER_ROLE_PREFILL ? WorkerRole::kPrefill : WorkerRole::kDecode;
  absl::MutexLock lock(&mu_);
  for (WorkerLoad& w : registry_.Snapshot(r)) {
    auto it = descriptions_.find(w.id);
    if (it == descriptions_.end() || it->second.role() != role || !w.healthy || w.draining ||
        exclude.contains(w.id)) {
      continue;
    }
    if (auto a = accounting_.find(w.id); a != accounting_.end()) {
      w.running = std::max(w.running + w.waiting, a->second.active);
      w.waiting = 0;
      w.free_blocks = std::max<int64_t>(0, w.free_blocks - a->second.blocks_since_heartbeat);
    }
    out.push_back(std::move(w));
  }
  return out;
}

absl::StatusOr<Cluster::Worker> Cluster::ChoosePrefill(
    const std::vector<int32_t>& prompt, const absl::flat_hash_set<std::string>& exclude) const {
  std::vector<WorkerLoad> live = Live(v1::WORKER_ROLE_PREFILL, exclude);
  if (live.empty()) return absl::UnavailableError("no live prefill worker");
  std::string address;
  {
    absl::MutexLock lock(&policy_mu_);
    prefill_policy_.SetWorkers(live);
    ASSIGN_OR_RETURN(address, prefill_policy_.Choose(prompt));
  }
  absl::MutexLock lock(&mu_);
  return Worker{address, descriptions_.at(address)};
}

absl::StatusOr<Cluster::Worker> Cluster::ChooseDecode(
    const DecodeDemand& demand, bool combined,
    const absl::flat_hash_set<std::string>& exclude) const {
  std::vector<WorkerLoad> live =
      Live(combined ? v1::WORKER_ROLE_COMBINED : v1::WORKER_ROLE_DECODE, exclude);
  if (live.empty())
    return absl::UnavailableError(combined ? "no live combined worker" : "no live decode worker");
  // KV pressure degrades service instead of toppling it: a worker above its high-water mark takes
  // no new work; when all are, the request is refused at once (the client retries later).
  std::erase_if(live, [](const WorkerLoad& w) { return w.kv_full; });
  if (live.empty()) {
    return absl::ResourceExhaustedError(
        "every decode worker is above its KV high-water mark; retry later");
  }
  ASSIGN_OR_RETURN(std::string address, ChooseDecodeWorker(live, demand));
  absl::MutexLock lock(&mu_);
  return Worker{address, descriptions_.at(address)};
}

absl::StatusOr<bool> Cluster::UseDisaggregated() const {
  if (num_live(v1::WORKER_ROLE_PREFILL) > 0 && num_live(v1::WORKER_ROLE_DECODE) > 0) return true;
  if (num_live(v1::WORKER_ROLE_COMBINED) > 0) return false;
  return absl::UnavailableError(absl::StrCat(
      "no live workers (prefill ", num_live(v1::WORKER_ROLE_PREFILL), ", decode ",
      num_live(v1::WORKER_ROLE_DECODE), ", combined ", num_live(v1::WORKER_ROLE_COMBINED), ")"));
}

int64_t Cluster::num_live(v1::WorkerRole role) const {
  return static_cast<int64_t>(Live(role, {}).size());
}

int64_t Cluster::max_model_len() const {
  absl::MutexLock lock(&mu_);
  int64_t m = 0;
  for (const auto& [address, d] : descriptions_) {
    if (d.max_model_len() > 0 && (m == 0 || d.max_model_len() < m)) m = d.max_model_len();
  }
  return m;
}

std::shared_ptr<grpc::Channel> Cluster::Channel(const std::string& address) {
  std::shared_ptr<grpc::Channel>& c = channels_[address];
  if (!c) {
    grpc::ChannelArguments args;
    // Detect a dead peer on an idle connection: keepalive pings, failing within a few seconds.
    const int keepalive_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.keepalive));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                static_cast<int>(absl::ToInt64Milliseconds(options_.keepalive_timeout)));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    c = rpc::CreateTlsChannel(address, options_.tls, args);
  }
  return c;
}

v1::Prefill::Stub* Cluster::prefill_stub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& s = prefill_stubs_[address];
  if (!s) s = v1::Prefill::NewStub(Channel(address));
  return s.get();
}

v1::Decode::Stub* Cluster::decode_stub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& s = decode_stubs_[address];
  if (!s) s = v1::Decode::NewStub(Channel(address));
  return s.get();
}

v1::ListWorkersResponse Cluster::List() const {
  v1::ListWorkersResponse out;
  absl::flat_hash_set<std::string> live;
  for (v1::WorkerRole r :
       {v1::WORKER_ROLE_PREFILL, v1::WORKER_ROLE_DECODE, v1::WORKER_ROLE_COMBINED}) {
    for (const WorkerLoad& w : Live(r, {})) live.insert(w.id);
  }
  absl::MutexLock lock(&mu_);
  std::vector<std::string> addresses;
  for (const auto& [address, d] : descriptions_) addresses.push_back(address);
  std::sort(addresses.begin(), addresses.end());
  for (const std::string& a : addresses) {
    v1::WorkerInfo* info = out.add_workers();
    *info->mutable_worker() = descriptions_.at(a);
    if (auto it = loads_.find(a); it != loads_.end()) *info->mutable_load() = it->second;
    info->set_state(live.contains(a) ? "SERVING" : "UNHEALTHY");
    if (live.contains(a)) out.add_live(a);
  }
  return out;
}

void Cluster::PollWorkers() {
  absl::flat_hash_map<std::string, std::unique_ptr<v1::WorkerStatus::Stub>> stubs;
  absl::flat_hash_set<std::string> registered;
  absl::flat_hash_set<std::string> departing;  // gone from DNS, still answering
  std::vector<std::string> gone;               // departed and no longer answering
  absl::flat_hash_map<std::string, std::vector<std::string>> resolved;  // by DNS target
  absl::Time next_resolve = absl::InfinitePast();
  auto add = [&](const std::string& a) {
    if (stubs.contains(a)) return;
    std::shared_ptr<grpc::Channel> channel;
    {
      absl::MutexLock lock(&mu_);
      channel = Channel(a);
    }
    stubs[a] = v1::WorkerStatus::NewStub(channel);
  };
  for (const std::string& a : options_.static_workers) add(a);
  do {
    if (!options_.dns_workers.empty() && absl::Now() >= next_resolve) {
      // Each name's addresses now; a name that fails to resolve keeps its last answer (a DNS
      // hiccup must not drop every worker), one with no address (no ready pod) has none.
      for (const std::string& target : options_.dns_workers) {
        absl::StatusOr<std::vector<std::string>> r = ResolveAll(target, options_.dns_server);
        if (r.ok()) {
          resolved[target] = *std::move(r);
        } else if (r.status().code() == absl::StatusCode::kNotFound) {
          resolved[target].clear();
        } else {
          TANDEM_LOG(WARNING) << "worker discovery: " << r.status();
        }
      }
      absl::flat_hash_set<std::string> wanted(options_.static_workers.begin(),
                                              options_.static_workers.end());
      for (const auto& [target, addresses] : resolved)
        wanted.insert(addresses.begin(), addresses.end());
      for (const std::string& a : wanted) {
        if (!stubs.contains(a)) TANDEM_LOG(INFO) << "worker discovery: " << a << " appeared";
        add(a);
      }
      // Gone from DNS (a terminating pod leaves its Service at once): no new work, but its streams
      // in flight go on — it is polled, as draining, until it stops answering (it exited).
      for (auto& [address, stub] : stubs) {
        if (wanted.contains(address)) {
          departing.erase(address);
        } else if (departing.insert(address).second) {
          TANDEM_LOG(INFO) << "worker discovery: " << address
                           << " is gone from DNS: no new work, polled until it exits";
        }
      }
      next_resolve = absl::Now() + options_.dns_refresh;
    }
    for (auto& [address, stub] : stubs) {
      grpc::ClientContext ctx;
      rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(1));
      v1::WorkerInfo info;
      const grpc::Status s = stub->GetStatus(&ctx, v1::GetStatusRequest(), &info);
      if (!s.ok() && departing.contains(address)) {
        gone.push_back(address);
        continue;
      }
      if (!s.ok() || info.state() == "LOADING") continue;  // no heartbeat: liveness runs out
      if (departing.contains(address)) info.mutable_load()->set_draining(true);
      if (!registered.contains(address)) {
        v1::WorkerDescription d = info.worker();
        d.set_address(address);  // the address we reach it by
        if (absl::Status r = Register(d); !r.ok()) {
          TANDEM_LOG(ERROR) << "polled worker " << address << ": " << r;
          continue;
        }
        registered.insert(address);
      }
      (void)Heartbeat(address, info.load());
    }
    for (const std::string& a : gone) {
      TANDEM_LOG(INFO) << "worker discovery: " << a << " left";
      stubs.erase(a);
      departing.erase(a);
      registered.erase(a);
    }
    gone.clear();
  } while (!stop_.WaitForNotificationWithTimeout(options_.poll_interval));
}

}  // namespace tandem::router
