// KV-transfer bandwidth: one request's KV (every layer of its blocks, K and V, f32) sent layer by
// layer from a sender storage into reserved blocks of a receiver storage, as a prefill worker sends
// to a decode worker. Geometries of real presets; prints GB/s per geometry and prompt length.
//   --device cpu (default): both ends in this process over loopback TCP, with a memcpy of the same
//     bytes side by side (the ceiling of a copy through host memory on this machine).
//   --device cuda: the receiver is a second process on the same GPU (this program again, with its
//   own
//     NCCL_HOSTID, as two workers sharing a GPU run), and each --transports entry is measured side
//     by side: tcp (layers staged through host memory), nccl (the NCCL link: its socket transport,
//     between two processes on one GPU) and cuda-ipc (the receiver maps the sender's staging).
//
//   With --tls-certs DIR (scripts/make_certs.sh DIR node:IP:127.0.0.1), the CPU run measures the
//   same transfers over TLS too (KV TLS, kv_stream.h), side by side.
//
//   kv_transfer_bench [--presets qwen2.5-0.5b,llama-3-8b] [--tokens 512,2048] [--iterations 5]
//                     [--device cuda [--transports tcp,nccl,cuda-ipc]] [--two-processes]
//                     [--tls-certs DIR]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cli/presets.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/create_backend.h"
#include "common/base/command_line.h"
#include "common/base/subprocess.h"
#include "common/transport/kv_control.h"
#include "common/transport/kv_data_paths.h"

ABSL_FLAG(std::vector<std::string>, presets,
          std::vector<std::string>({"qwen2.5-0.5b", "llama-3-8b"}),
          "model presets whose KV geometry is transferred");
ABSL_FLAG(std::vector<std::string>, tokens, std::vector<std::string>({"512", "2048"}),
          "prompt lengths");
ABSL_FLAG(int, iterations, 5, "transfers per measurement (the best is reported)");
ABSL_FLAG(int, block_size, 16, "tokens per KV block");
ABSL_FLAG(std::string, device, "cpu",
          "cpu (one process, loopback TCP) or cuda (two processes on one GPU)");
ABSL_FLAG(std::vector<std::string>, transports,
          std::vector<std::string>({"tcp", "nccl", "cuda-ipc"}),
          "with --device cuda: the data paths measured side by side");
ABSL_FLAG(bool, two_processes, false,
          "the --device cuda layout (receiver in a second process) on any device; --device cpu "
          "with --transports tcp checks it without a GPU");
ABSL_FLAG(std::string, role, "",
          "internal: 'receiver' is the receiving process of a --device cuda run");
ABSL_FLAG(std::string, ready_file, "", "internal: where the receiver writes its port");
ABSL_FLAG(std::string, tls_certs, "",
          "--device cpu: a directory with ca.pem, node.pem and node.key (scripts/make_certs.sh DIR "
          "node:IP:127.0.0.1): the transfers over TLS as well, side by side");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "two-process runs: what the caches store: f32, bf16 (half the bytes), int8 (a quarter, "
          "plus a scale per token and head) or fp8 (a quarter; CUDA)");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<KvCacheGeometry> Geometry(const std::string& preset_name, int64_t tokens) {
  auto preset = FindModelPreset(preset_name);
  if (!preset.ok()) return preset.status();
  const ModelConfig& c = preset->config;
  const int64_t bs = absl::GetFlag(FLAGS_block_size);
  KvCacheGeometry g{c.num_hidden_layers, (tokens + bs - 1) / bs, bs, c.num_key_value_heads,
                    c.head_dim};
  std::optional<DType> dtype;
  if (!ParseKvCacheDType(absl::GetFlag(FLAGS_kv_dtype), &dtype) || !dtype.has_value() ||
      *dtype == DType::kF16) {
    return absl::InvalidArgumentError("--kv-dtype must be f32, bf16, int8 or fp8");
  }
  g.dtype = *dtype;
  return g;
}

// The cache content both processes know: element i of layer l of K (V: negated), in the cache's
// dtype; for the 8-bit caches a byte pattern over the whole layer, scales included (zeros when
// !fill).
std::vector<char> LayerBytes(const KvCacheGeometry& g, int64_t layer, bool v, bool fill) {
  std::vector<char> bytes(static_cast<size_t>(g.bytes_per_layer()), 0);
  if (!fill) return bytes;
  if (g.dtype != DType::kF32 && g.dtype != DType::kBF16) {
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<char>((layer * 7919 + static_cast<int64_t>(i) * 31 + v) & 0xff);
    return bytes;
  }
  for (int64_t i = 0; i < g.elements_per_layer(); ++i) {
    const float x = (v ? -1.f : 1.f) * static_cast<float>((layer * 7919 + i) % 1000);
    if (g.dtype == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &x, 4);
    } else {
      const uint16_t h = F32ToBf16(x);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

struct GpuEnd {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KvCacheStorage> storage;
  std::unique_ptr<KvLinkFactory> links;  // when the transport is nccl or cuda-ipc
  std::vector<int32_t> table;            // every block, in order
};

absl::StatusOr<GpuEnd> MakeGpuEnd(const KvCacheGeometry& g, const std::string& transport,
                                  bool fill) {
  GpuEnd e;
  auto backend = CreateBackend({.device = absl::GetFlag(FLAGS_device)});
  if (!backend.ok()) return backend.status();
  e.backend = *std::move(backend);
  auto storage = KvCacheStorage::Create(e.backend.get(), g);
  if (!storage.ok()) return storage.status();
  e.storage = *std::move(storage);
  for (int64_t b = 0; b < g.num_blocks; ++b) e.table.push_back(static_cast<int32_t>(b));
  for (int64_t l = 0; l < g.num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv)
      e.storage->WriteBlocks(kv == 1, l, e.table, LayerBytes(g, l, kv == 1, fill).data());
  }
  if (transport != "tcp") {
    auto links = CreateKvLinkFactory(transport, e.storage.get());
    if (!links.ok()) return links.status();
    e.links = *std::move(links);
  }
  return e;
}

// The receiving process: expects warm-up + iterations transfers of every block, then checks the
// last.
int RunReceiver() {
  ::setenv("NCCL_HOSTID", "tandem-kv-bench-receiver", 1);
  const std::string transport = absl::GetFlag(FLAGS_transports).at(0);
  int64_t tokens = 0;
  if (!absl::SimpleAtoi(absl::GetFlag(FLAGS_tokens).at(0), &tokens)) return 2;
  auto g = Geometry(absl::GetFlag(FLAGS_presets).at(0), tokens);
  if (!g.ok()) return 2;
  auto end = MakeGpuEnd(*g, transport, /*fill=*/false);
  if (!end.ok()) {
    std::fprintf(stderr, "receiver: %s\n", end.status().ToString().c_str());
    return 1;
  }
  KvControlReceiver::Options o{
      "127.0.0.1", 0, end->storage.get(), {"bench", *g}, absl::Seconds(60)};
  if (end->links != nullptr) o.link_factories = {end->links.get()};
  auto receiver = KvControlReceiver::Create(o);
  if (!receiver.ok()) return 1;
  const int transfers = absl::GetFlag(FLAGS_iterations) + 1;
  for (int it = 0; it < transfers; ++it) {
    if (!(*receiver)->Expect(absl::StrCat("r", it), end->table, "").ok()) return 1;
  }
  {
    std::FILE* f = std::fopen(absl::GetFlag(FLAGS_ready_file).c_str(), "w");
    if (f == nullptr) return 1;
    std::fprintf(f, "%d\n", (*receiver)->port());
    std::fclose(f);
  }
  for (int it = 0; it < transfers; ++it) {
    if (auto w = (*receiver)->Wait(absl::StrCat("r", it), absl::Seconds(300)); !w.ok()) {
      std::fprintf(stderr, "receiver: %s\n", w.status().ToString().c_str());
      return 1;
    }
  }
  std::vector<char> layer(static_cast<size_t>(g->bytes_per_layer()));
  for (int64_t l = 0; l < g->num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      end->storage->ReadBlocks(kv == 1, l, end->table, layer.data());
      if (layer != LayerBytes(*g, l, kv == 1, /*fill=*/true)) {
        std::fprintf(stderr, "receiver: transferred KV differs from the source (layer %lld)\n",
                     static_cast<long long>(l));
        return 1;
      }
    }
  }
  // Stay until the sender has its last acknowledgement: Wait() returns once the blocks have landed,
  // which can be before the connection's thread has written that acknowledgement, and exiting then
  // closes the connection under it ("peer closed the connection" on the sender).
  const std::string done = absl::GetFlag(FLAGS_ready_file) + ".done";
  for (int i = 0; i < 1200 && ::access(done.c_str(), F_OK) != 0; ++i)
    absl::SleepFor(absl::Milliseconds(50));
  return 0;
}

// One --device cuda measurement: best seconds per transfer (Begin to the receiver's
// acknowledgement).
absl::StatusOr<double> MeasureGpu(const std::string& preset, int64_t tokens,
                                  const std::string& transport) {
  auto g = Geometry(preset, tokens);
  if (!g.ok()) return g.status();
  auto end = MakeGpuEnd(*g, transport, /*fill=*/true);
  if (!end.ok()) return end.status();
  const std::string ready =
      absl::StrCat("/tmp/kv_transfer_bench_", ::getpid(), "_", transport, "_", tokens);
  std::remove(ready.c_str());
  std::remove((ready + ".done").c_str());
  const int iterations = absl::GetFlag(FLAGS_iterations);
  auto child = Subprocess::Spawn(
      {ExecutableDir() + "/kv_transfer_bench", "--role=receiver",
       "--device=" + absl::GetFlag(FLAGS_device), "--transports=" + transport,
       "--presets=" + preset, "--two-processes", absl::StrCat("--tokens=", tokens),
       absl::StrCat("--iterations=", iterations), absl::StrCat("--block-size=", g->block_size),
       "--ready-file=" + ready, "--kv-dtype=" + absl::GetFlag(FLAGS_kv_dtype)},
      "");
  if (!child.ok()) return child.status();
  int port = 0;
  for (int i = 0; i < 1200 && port == 0; ++i) {
    if (!child->running()) return absl::InternalError("the receiver process exited early");
    (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFileFrom(ready)), &port);
    if (port == 0) absl::SleepFor(absl::Milliseconds(100));
  }
  if (port == 0) return absl::DeadlineExceededError("the receiver did not start");
  auto sender = KvControlSender::Connect(absl::StrCat("127.0.0.1:", port), {"bench", *g},
                                         absl::Seconds(60), end->links.get());
  if (!sender.ok()) return sender.status();
  double best = 1e30;
  for (int it = 0; it <= iterations; ++it) {  // transfer 0 warms up
    const std::string id = absl::StrCat("r", it);
    const auto t0 = Clock::now();
    absl::Status s = (*sender)->Begin(id, tokens, "");
    for (int32_t l = 0; s.ok() && l < g->num_layers; ++l)
      s = (*sender)->SendLayer(id, l, end->table, end->storage.get());
    if (s.ok()) s = (*sender)->End(id, 1);
    if (!s.ok()) {
      // Say how the receiver ended (a crash prints nothing of its own), and leave no ready file.
      const std::optional<int> status = child->Wait(absl::Seconds(10));
      std::remove(ready.c_str());
      std::remove((ready + ".done").c_str());
      std::string how = "still running";
      if (status.has_value() && WIFSIGNALED(*status)) {
        how = absl::StrCat("killed by signal ", WTERMSIG(*status));
      } else if (status.has_value() && WIFEXITED(*status)) {
        how = absl::StrCat("exited with ", WEXITSTATUS(*status));
      }
      return absl::Status(s.code(), absl::StrCat(s.message(), " (the receiver: ", how, ")"));
    }
    if (it > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const std::string done = ready + ".done";
  if (std::FILE* f = std::fopen(done.c_str(), "w")) std::fclose(f);  // the receiver may exit now
  std::optional<int> status = child->Wait(absl::Seconds(120));
  std::remove(ready.c_str());
  std::remove(done.c_str());
  if (!status.has_value() || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError("the receiver failed (its stderr is above)");
  }
  return best;
}

int RunGpu() {
  ::setenv("NCCL_HOSTID", "tandem-kv-bench-sender", 1);
  ::setenv("NCCL_SOCKET_IFNAME", "lo",
           0);  // the pair talks over loopback (the receiver inherits it)
  const std::vector<std::string> transports = absl::GetFlag(FLAGS_transports);
  std::printf("%-14s %7s %10s", "geometry", "tokens", "MiB");
  for (const std::string& t : transports) std::printf(" %10s", (t + " GB/s").c_str());
  std::printf("\n");
  for (const std::string& name : absl::GetFlag(FLAGS_presets)) {
    for (const std::string& t : absl::GetFlag(FLAGS_tokens)) {
      int64_t tokens = 0;
      if (!absl::SimpleAtoi(t, &tokens) || tokens <= 0) return 2;
      auto g = Geometry(name, tokens);
      if (!g.ok()) {
        std::fprintf(stderr, "%s\n", g.status().ToString().c_str());
        return 2;
      }
      const double bytes = 2.0 * static_cast<double>(g->num_layers * g->bytes_per_layer());
      std::printf("%-14s %7lld %10.1f", name.c_str(), static_cast<long long>(tokens),
                  bytes / (1 << 20));
      for (const std::string& transport : transports) {
        auto seconds = MeasureGpu(name, tokens, transport);
        if (!seconds.ok()) {
          std::fprintf(stderr, "\n%s: %s\n", transport.c_str(),
                       seconds.status().ToString().c_str());
          return 1;
        }
        std::printf(" %10.2f", bytes / *seconds / 1e9);
        std::fflush(stdout);
      }
      std::printf("\n");
    }
  }
  return 0;
}

int Run() {
  auto backend = CpuBackend::Create({}).value();
  std::shared_ptr<KvTls> tls;
  if (const std::string dir = absl::GetFlag(FLAGS_tls_certs); !dir.empty()) {
    auto made = KvTls::Create({dir + "/node.pem", dir + "/node.key", dir + "/ca.pem"});
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", std::string(made.status().message()).c_str());
      return 2;
    }
    tls = *made;
  }
  std::printf("%-14s %7s %10s %12s %12s %12s", "geometry", "tokens", "MiB", "TCP GB/s",
              "memcpy GB/s", "TCP/memcpy");
  if (tls != nullptr) std::printf(" %12s %12s", "TLS GB/s", "TLS/TCP");
  std::printf("\n");
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
      for (int64_t i = 0; i < floats; ++i)
        static_cast<float*>(src->k_data())[i] = static_cast<float*>(src->v_data())[i] =
            static_cast<float>(i % 1000);
      const KvEndpointInfo info{"bench", g};
      std::vector<int32_t> table(blocks);
      for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
      const double bytes = 2.0 * static_cast<double>(floats) * sizeof(float);
      // The best of --iterations transfers over a new connection (TLS with `kv_tls`); 0 on error.
      auto measure = [&](KvTls* kv_tls) -> double {
        std::memset(dst->k_data(), 0, floats * sizeof(float));
        KvControlReceiver::Options o{"127.0.0.1", 0, dst.get(), info, absl::Seconds(30)};
        if (kv_tls != nullptr) o.tls = tls;
        auto receiver = KvControlReceiver::Create(o).value();
        auto sender = KvControlSender::Connect(
            absl::StrCat(kv_tls != nullptr ? kKvTlsScheme : "", "127.0.0.1:", receiver->port()),
            info, absl::Seconds(30), nullptr, kv_tls);
        if (!sender.ok()) {
          std::fprintf(stderr, "%s\n", std::string(sender.status().message()).c_str());
          return 0;
        }
        double best = 1e30;
        for (int it = 0; it < absl::GetFlag(FLAGS_iterations); ++it) {
          const std::string id = absl::StrCat("r", it);
          if (!receiver->Expect(id, table, "").ok()) return 0;
          const auto t0 = Clock::now();
          if (!(*sender)->Begin(id, tokens, "").ok()) return 0;
          for (int32_t l = 0; l < g.num_layers; ++l) {
            if (absl::Status s = (*sender)->SendLayer(id, l, table, src.get()); !s.ok()) {
              std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
              return 0;
            }
          }
          if (!(*sender)->End(id, 1).ok() || !receiver->Wait(id, absl::Seconds(30)).ok()) return 0;
          best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
        }
        if (std::memcmp(static_cast<float*>(src->k_data()), static_cast<float*>(dst->k_data()),
                        floats * sizeof(float)) != 0) {
          std::fprintf(stderr, "transferred KV differs from the source\n");
          return 0;
        }
        return best;
      };
      const double best = measure(nullptr);
      if (best == 0) return 1;
      double tls_best = 0;
      if (tls != nullptr && (tls_best = measure(tls.get())) == 0) return 1;
      double copy_best = 1e30;
      for (int it = 0; it < absl::GetFlag(FLAGS_iterations); ++it) {
        const auto t0 = Clock::now();
        std::memcpy(static_cast<float*>(dst->k_data()), static_cast<float*>(src->k_data()),
                    floats * sizeof(float));
        std::memcpy(static_cast<float*>(dst->v_data()), static_cast<float*>(src->v_data()),
                    floats * sizeof(float));
        copy_best = std::min(copy_best, std::chrono::duration<double>(Clock::now() - t0).count());
      }
      std::printf("%-14s %7lld %10.1f %12.2f %12.2f %12.2f", name.c_str(),
                  static_cast<long long>(tokens), bytes / (1 << 20), bytes / best / 1e9,
                  bytes / copy_best / 1e9, copy_best / best);
      if (tls != nullptr) std::printf(" %12.2f %12.2f", bytes / tls_best / 1e9, best / tls_best);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_role) == "receiver") return tandem::RunReceiver();
  if (absl::GetFlag(FLAGS_device) != "cpu" || absl::GetFlag(FLAGS_two_processes))
    return tandem::RunGpu();
  return tandem::Run();
}
