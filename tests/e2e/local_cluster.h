// A Tandem cluster on loopback for the end-to-end tests: a router and workers as real processes
// (the binaries CMake built), with logs in the test's temp dir. Workers can be killed, stopped and
// terminated one by one; their pools are read through their WorkerStatus service.
//
// The environment points the whole suite at a GPU (scripts/gpu_check.sh does):
//   TANDEM_E2E_DEVICE=cuda        every worker runs --device cuda --batch-invariant (and the tests'
//                                 reference engine the same, see E2eBackend);
//   TANDEM_E2E_KV_TRANSPORT=nccl  every worker moves KV over NCCL, each with its own --nccl-host-id
//                                 (=cuda-ipc: over CUDA IPC; =tcp: the default);
//   TANDEM_E2E_BIN_DIR=DIR        the router and workers from DIR instead of the build tree;
//   TANDEM_E2E_PREFILL_ARGS, TANDEM_E2E_DECODE_ARGS   space-separated flags added to every prefill,
//                                 and every decode or combined, worker (the run on the CUDA
//                                 emulator, a thousand times slower than a GPU, lengthens the KV
//                                 timeouts).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backend.h"
#include "common/base/subprocess.h"
#include "common/rpc/tls.h"
#include "grpcpp/grpcpp.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::e2e {

struct ClusterOptions {
  // (Every field has an initializer, so that designated initializers may leave any out.)
  std::string model_dir = {};
  int prefill = 1, decode = 1, combined = 0;
  std::vector<std::string> router_args = {};   // e.g. --max-queued-requests=2
  std::vector<std::string> worker_args = {};   // engine flags for every worker
  std::vector<std::string> prefill_args = {};  // for prefill workers only
  std::vector<std::string> decode_args = {};   // for decode and combined workers only
  // Workers start without --router and the router lists them with --workers (polled, no
  // heartbeats).
  bool static_workers = false;
  // How the cluster's own clients (generation(), registration(), Status) dial: plaintext unless
  // it names a CA or a certificate. The processes' --tls-* flags go in router_args/worker_args.
  rpc::TlsOptions tls = {};
};

// The backend the suite's in-process reference engine must use to match the workers bit for bit:
// the CPU, or the device TANDEM_E2E_DEVICE names with batch-invariant GEMMs.
absl::StatusOr<std::unique_ptr<Backend>> E2eBackend();

class LocalCluster {
 public:
  explicit LocalCluster(ClusterOptions options);
  // Stops every process; removes the processes' logs unless the running test has failed (they are
  // under the test temp dir, in cluster_<pid>_<n>/, then).
  ~LocalCluster();

  // Starts the router and workers; returns once the router lists every worker as live.
  absl::Status Start();
  // Starts one more worker ("prefill", "decode" or "combined"), with `extra_args` after the role's
  // usual flags, and waits until it is live.
  absl::StatusOr<std::string> AddWorker(const std::string& role,
                                        const std::vector<std::string>& extra_args = {});

  std::string router_address() const { return router_address_; }
  v1::Generation::Stub* generation() { return generation_.get(); }
  v1::Registration::Stub* registration() { return registration_.get(); }
  // Worker addresses by role, in start order.
  std::vector<std::string> workers(const std::string& role) const;
  Subprocess* process(const std::string& address);
  // The worker's own view of its load (free blocks etc.).
  absl::StatusOr<v1::WorkerInfo> Status(const std::string& address);
  // Polls until every worker's pool is fully free and nothing runs or waits; false after `timeout`.
  bool WaitIdle(absl::Duration timeout, std::string* why = nullptr);
  // Addresses the router currently routes to.
  std::vector<std::string> Live();
  std::string Log(const std::string& address) const;

 private:
  struct Proc {
    std::string role, address, log;
    std::unique_ptr<Subprocess> process;
  };
  absl::StatusOr<std::string> SpawnWorker(const std::string& role,
                                          const std::vector<std::string>& extra_args = {});
  absl::Status WaitLive(size_t n, absl::Duration timeout);

  ClusterOptions options_;
  std::string dir_;
  std::string router_address_;
  std::unique_ptr<Subprocess> router_;
  std::vector<Proc> workers_;
  std::unique_ptr<v1::Generation::Stub> generation_;
  std::unique_ptr<v1::Registration::Stub> registration_;
  int next_ = 0;
};

// A TCP port free on every address now, below the ephemeral range (bound and released: fine for
// tests).
int FreePort();

}  // namespace tandem::e2e
