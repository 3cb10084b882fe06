// tandem-decode-worker: runs the engine in the decode role (or, with --combined, prefill and decode
// in one process) and serves tandem.v1.Decode. See decode_service.h and
// common/serving/worker_host.h.
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "common/backend/cpu/openblas_setup.h"
#include "common/base/command_line.h"
#include "common/serving/worker_host.h"
#include "decode_worker/decode_service.h"

ABSL_FLAG(bool, combined, false,
          "combined role: compute prompts here too (no KV transfer), the baseline");
ABSL_FLAG(int32_t, kv_port, 0,
          "TCP port of the KV receiver (0 = any free port; registered with the router)");
ABSL_FLAG(double, kv_transfer_timeout_s, 30, "seconds a reservation waits for its KV transfer");
ABSL_FLAG(double, kv_io_timeout_s, 10,
          "seconds a KV connection's handshake, a frame begun, or a layer's NCCL receive may take "
          "before that connection (and its NCCL communicator) is dropped");
ABSL_FLAG(double, kv_idle_connection_s, 600,
          "seconds a KV connection may bring nothing, while no transfer begun on it still waits, "
          "before it is closed with its NCCL communicator (a stopped or wedged prefill worker's; "
          "an idle one reconnects before its next transfer); 0 = never");
ABSL_FLAG(double, kv_high_water, 0.95,
          "share of the KV pool in use above which the worker reports itself full and the router "
          "sends it nothing new (1 = never)");

int main(int argc, char** argv) {
  tandem::MaybeReexecWithFasterOpenBlasCore(argv);
  absl::SetProgramUsageMessage(
      "tandem-decode-worker --model DIR [--port P] [--router HOST:PORT] [--combined] [--kv-port P] "
      "...\nDecode worker of a Tandem cluster; --helpfull lists every flag.");
  tandem::ParseCommandLine(argc, argv);
  tandem::DecodeService::Options o;
  o.combined = absl::GetFlag(FLAGS_combined);
  o.bind_address = absl::GetFlag(FLAGS_bind_address);
  o.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  o.kv_port = absl::GetFlag(FLAGS_kv_port);
  o.kv_transfer_timeout = absl::Seconds(absl::GetFlag(FLAGS_kv_transfer_timeout_s));
  o.kv_io_timeout = absl::Seconds(absl::GetFlag(FLAGS_kv_io_timeout_s));
  if (!(o.kv_transfer_timeout > absl::ZeroDuration() && o.kv_io_timeout > absl::ZeroDuration())) {
    std::fprintf(
        stderr,
        "tandem-decode-worker: --kv-transfer-timeout-s and --kv-io-timeout-s must be positive\n");
    return 2;
  }
  const double idle_s = absl::GetFlag(FLAGS_kv_idle_connection_s);
  if (!(idle_s >= 0)) {
    std::fprintf(stderr, "tandem-decode-worker: --kv-idle-connection-s must be >= 0 (0 = never)\n");
    return 2;
  }
  o.kv_idle_connection = idle_s > 0 ? absl::Seconds(idle_s) : absl::InfiniteDuration();
  o.kv_high_water = absl::GetFlag(FLAGS_kv_high_water);
  if (!(o.kv_high_water > 0 && o.kv_high_water <= 1)) {
    std::fprintf(stderr, "tandem-decode-worker: --kv-high-water must be in (0, 1]\n");
    return 2;
  }
  tandem::DecodeService service(o);
  return tandem::RunWorker(
      o.combined ? "combined-worker" : "decode-worker",
      o.combined ? tandem::v1::WORKER_ROLE_COMBINED : tandem::v1::WORKER_ROLE_DECODE, &service);
}
