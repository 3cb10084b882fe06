// A Backend that forwards every op to a CPU backend, for tests that change one thing about a
// backend (what Memory() reports, whether logprobs are computed "on the device") and keep the CPU's
// results.
#pragma once

#include <memory>
#include <string>

#include "common/backend/backend_wrapper.h"
#include "common/backend/cpu/cpu_backend.h"

namespace tandem {

class ForwardingBackend : public BackendWrapper {
 public:
  ForwardingBackend()
      : BackendWrapper(CpuBackend::Create({}).value()), cpu_(static_cast<CpuBackend*>(inner())) {}

  std::string name() const override { return "forwarding"; }
  std::string device_description() const override { return "cpu behind a test backend"; }

 protected:
  CpuBackend* cpu_;
};

}  // namespace tandem
