// What the CUDA emulator counts, for tests that run the CUDA backend on it (a plain header: unlike
// cuda_emu.h it defines no device macros, so host code may include it).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem_emu {

// Kernel grids run in this process so far (a graph replay counts each kernel it runs).
uint64_t KernelsRun();

// The runtime calls that give the device work or make the host wait for it, as the process makes
// them (whatever thread), logged from StartHostLog() until TakeHostLog() returns them and stops:
// what a test needs to check that a step waits for the device only to read its results.
enum class HostCall {
  kLaunch,  // a kernel, a GEMM, a graph, a device-side copy or memset enqueued
  kUpload,  // a copy from the host enqueued
  kRead,    // a copy to the host (into pageable memory the host waits for it on a device)
  kWait,  // a synchronisation: of a stream, an event, the device; cudaMemcpy, cudaMemset, cudaFree
};
struct HostCallEntry {
  HostCall kind;
  const char* what;  // the call, or the kernel's name
};
void StartHostLog();
std::vector<HostCallEntry> TakeHostLog();

}  // namespace tandem_emu
