#include "common/backend/cpu/openblas_setup.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tandem {

void MaybeReexecWithFasterOpenBlasCore(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr ||
      std::getenv("TANDEM_KEEP_OPENBLAS_CORE") != nullptr) {
    return;
  }
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return;
  const char* core = openblas_get_corename();
  if (core == nullptr) return;
  const bool sse_only = std::strcmp(core, "Prescott") == 0 || std::strcmp(core, "Core2") == 0 ||
                        std::strcmp(core, "Penryn") == 0 || std::strcmp(core, "Dunnington") == 0 ||
                        std::strcmp(core, "Nehalem") == 0 || std::strcmp(core, "Katmai") == 0 ||
                        std::strcmp(core, "Northwood") == 0;
  if (!sse_only) return;
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  execv("/proc/self/exe", argv);
  // execv failed: carry on with the slower kernels.
  std::fprintf(stderr, "note: could not re-exec with OPENBLAS_CORETYPE=Haswell; using %s kernels\n",
               core);
}

}  // namespace tandem
