// OpenBLAS 0.3.21 (Debian 12) picks its kernels at load time from the CPU model; on CPUs it does
// not recognise (common on virtual machines that report a generic "Xeon Processor") it falls back
// to SSE3 "Prescott" kernels, about 2.5× slower than its AVX2 "Haswell" ones. The choice can only
// be overridden by OPENBLAS_CORETYPE before the library loads, so a program calls this first thing
// in main(): when OpenBLAS chose an SSE-only core although the CPU has AVX2 and FMA, and the user
// has not set OPENBLAS_CORETYPE, it re-executes itself with OPENBLAS_CORETYPE=Haswell.
// Set TANDEM_KEEP_OPENBLAS_CORE=1 to keep OpenBLAS's own choice.
#pragma once

namespace tandem {

void MaybeReexecWithFasterOpenBlasCore(char** argv);

}  // namespace tandem
