// tandem-prefill-worker: runs the engine in the prefill role and serves tandem.v1.Prefill, sending
// each prompt's KV to its decode worker. See prefill_service.h and common/serving/worker_host.h.
#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "common/backend/cpu/openblas_setup.h"
#include "common/base/command_line.h"
#include "common/serving/worker_host.h"
#include "prefill_worker/prefill_service.h"

ABSL_FLAG(bool, layerwise_transfer, true,
          "send each layer's KV while the next layer computes (false: after the whole prompt, for "
          "comparison)");
ABSL_FLAG(double, kv_io_timeout_s, 10,
          "seconds a KV send or acknowledgement may take before the transfer fails");
ABSL_FLAG(
    int32_t, fault_stop_after_kv_layer, -1,
    "fault drill: once layer N of a KV transfer has been sent, the process stops itself (SIGSTOP), "
    "once: a peer hung mid-transfer (then SIGCONT or SIGKILL it); -1 (default): never");

int main(int argc, char** argv) {
  tandem::MaybeReexecWithFasterOpenBlasCore(argv);
  absl::SetProgramUsageMessage(
      "tandem-prefill-worker --model DIR [--port P] [--router HOST:PORT] [--layerwise-transfer] "
      "...\nPrefill worker of a Tandem cluster; --helpfull lists every flag.");
  tandem::ParseCommandLine(argc, argv);
  tandem::PrefillService::Options o;
  o.layerwise_transfer = absl::GetFlag(FLAGS_layerwise_transfer);
  o.kv_io_timeout = absl::Seconds(absl::GetFlag(FLAGS_kv_io_timeout_s));
  o.fault_stop_after_kv_layer = absl::GetFlag(FLAGS_fault_stop_after_kv_layer);
  tandem::PrefillService service(o);
  return tandem::RunWorker("prefill-worker", tandem::v1::WORKER_ROLE_PREFILL, &service);
}
