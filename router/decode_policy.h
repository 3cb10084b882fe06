// Chooses the decode worker for a request: among healthy workers whose free KV blocks can hold the
// prompt (plus headroom for its output), the one with the lowest KV usage (fraction of its pool in
// use) plus share of the sequences running or waiting across the workers: memory pressure and batch
// size both count, and equal workers take turns. Ties go to the first in the list. When none can,
// the request is refused at once (RESOURCE_EXHAUSTED): backpressure before any prefill work. Pure
// logic.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "router/worker_load.h"

namespace tandem::router {

struct DecodeDemand {
  int64_t prompt_tokens = 0;
  int64_t max_output_tokens = 0;
  // Share of max_output_tokens that must fit up front (outputs rarely reach their cap).
  double output_headroom = 0.25;
};

absl::StatusOr<std::string> ChooseDecodeWorker(const std::vector<WorkerLoad>& workers,
                                               const DecodeDemand& demand);

}  // namespace tandem::router
