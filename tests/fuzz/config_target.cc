// libFuzzer target: config.json text through ParseModelConfig (every architecture field, rope
// scaling, quantization_config): a config or an error, never a crash.
#include <cstdint>
#include <string>

#include "common/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)tandem::ParseModelConfig(text, "fuzz/config.json");
  return 0;
}
