// libFuzzer target: a safetensors file (header length, JSON header, data) as SafetensorsFile::Open
// reads it from disk. Every outcome is a file or an error; a tensor it accepts lies inside the
// file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/tensor/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("safetensors_fuzz", 0);
  if (fd < 0) return 0;
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  auto file = tandem::SafetensorsFile::Open("/proc/self/fd/" + std::to_string(fd));
  if (file.ok()) {
    for (const auto& [name, view] : (*file)->tensors()) {
      // Touch the first and last byte of each tensor: out-of-bounds views trip ASan or SIGSEGV.
      const auto* bytes = reinterpret_cast<const volatile uint8_t*>(view.data);
      const size_t n = view.nbytes;
      if (n > 0) (void)(bytes[0] + bytes[n - 1]);
    }
  }
  ::close(fd);
  return 0;
}
