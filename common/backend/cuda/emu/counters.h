// What the CUDA emulator counts, for tests that run the CUDA backend on it (a plain header: unlike
// cuda_emu.h it defines no device macros, so host code may include it).
#pragma once

#include <cstdint>

namespace tandem_emu {

// Kernel grids run in this process so far (a graph replay counts each kernel it runs).
uint64_t KernelsRun();

}  // namespace tandem_emu
