// KV-transfer bandwidth of the TCP transport on loopback: one request's KV (every layer of its
// blocks, K and V, f32) sent layer by layer from a sender storage into reserved blocks of a receiver
// storage, as a prefill worker sends to a decode worker. Geometries of real presets; prints MB/s
// and GB/s per geometry and prompt length, with a memcpy of the same bytes side by side (the
// ceiling of a copy through host memory on this machine).
//
//   kv_transfer_bench [--presets qwen2.5-0.5b,llama-3-8b] [--tokens 512,2048] [--iterations 5]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/base/command_line.h"
#include "common/model/presets.h"
#include "common/transport/tcp/tcp_kv_transport.h"

ABSL_FLAG(std::vector<std::string>, presets, std::vector<std::string>({"qwen2.5-0.5b", "llama-3-8b"}),
          "model presets whose KV geometry is transferred");
ABSL_FLAG(std::vector<std::string>, tokens, std::vector<std::string>({"512", "2048"}), "prompt lengths");
ABSL_FLAG(int, iterations, 5, "transfers per measurement (the best is reported)");
ABSL_FLAG(int, block_size, 16, "tokens per KV block");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

int Run() {
  auto backend = CpuBackend::Create({}).value();
  std::printf("%-14s %7s %10s %12s %12s %12s\n", "geometry", "tokens", "MiB", "TCP GB/s", "memcpy GB/s", "TCP/memcpy");
  for (const std::string& name : absl::GetFlag(FLAGS_presets)) {
    auto preset = FindModelPreset(name);
    if (!preset.ok()) {
      std::fprintf(stderr, "%s\n", std::string(preset.status().message()).c_str());
      return 2;
    }
    const ModelConfig& c = preset->config;
    for (const std::string& t : absl::GetFlag(FLAGS_tokens)) {
      const int64_t tokens = std::stoll(t);
      const int64_t bs = absl::GetFlag(FLAGS_block_size);
      const int64_t blocks = (tokens + bs - 1) / bs;
      const KvCacheGeometry g{c.num_hidden_layers, blocks, bs, c.num_key_value_heads, c.head_dim};
      auto src = KvCacheStorage::Create(backend.get(), g).value();
      auto dst = KvCacheStorage::Create(backend.get(), g).value();
      const int64_t floats = g.num_layers * g.elements_per_layer();
      for (int64_t i = 0; i < floats; ++i) src->k()[i] = src->v()[i] = static_cast<float>(i % 1000);
      const KvEndpointInfo info{"bench", g};
      auto receiver = TcpKvReceiver::Create({"127.0.0.1", 0, dst.get(), info, absl::Seconds(30)}).value();
      auto sender = TcpKvSender::Connect(absl::StrCat("127.0.0.1:", receiver->port()), info, absl::Seconds(30)).value();
      std::vector<int32_t> table(blocks);
      for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
      const double bytes = 2.0 * static_cast<double>(floats) * sizeof(float);
      double best = 1e30;
      for (int it = 0; it < absl::GetFlag(FLAGS_iterations); ++it) {
        const std::string id = absl::StrCat("r", it);
        if (!receiver->Expect(id, table).ok()) return 1;
        const auto t0 = Clock::now();
        if (!sender->Begin(id, tokens).ok()) return 1;
        for (int32_t l = 0; l < g.num_layers; ++l) {
          if (absl::Status s = sender->SendLayer(id, l, table, src.get()); !s.ok()) {
            std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
            return 1;
          }
        }
        if (!sender->End(id, 1).ok() || !receiver->Wait(id, absl::Seconds(30)).ok()) return 1;
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
      }
      if (std::memcmp(src->k(), dst->k(), floats * sizeof(float)) != 0) {
        std::fprintf(stderr, "transferred KV differs from the source\n");
        return 1;
      }
      double copy_best = 1e30;
      for (int it = 0; it < absl::GetFlag(FLAGS_iterations); ++it) {
        const auto t0 = Clock::now();
        std::memcpy(dst->k(), src->k(), floats * sizeof(float));
        std::memcpy(dst->v(), src->v(), floats * sizeof(float));
        copy_best = std::min(copy_best, std::chrono::duration<double>(Clock::now() - t0).count());
      }
      std::printf("%-14s %7lld %10.1f %12.2f %12.2f %12.2f\n", name.c_str(), static_cast<long long>(tokens),
                  bytes / (1 << 20), bytes / best / 1e9, bytes / copy_best / 1e9, copy_best / best);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseCommandLine(argc, argv);
  return tandem::Run();
}
