// `tandem plan`: capacity planning from the checkpoint's headers and the engine flags, without
// loading a weight (common/model/memory_plan.h): what the weights take (quantized or not), the KV
// cache per token, an activation reserve, and how many sequences of which lengths fit in --memory.
#include <cstdio>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "common/model/memory_plan.h"
#include "common/serving/engine_flags.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(bool, json);
ABSL_FLAG(std::string, memory, "",
          "plan: bytes the engine may use for weights, activations and KV cache (e.g. 16G, "
          "512M): a GPU's memory × --gpu-memory-utilization, or the RAM given to a CPU worker");

namespace tandem::cli {
namespace {

int PlanFail(const absl::Status& s) {
  std::fprintf(stderr, "tandem plan: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

std::string Mib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

int PlanCommand() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return PlanFail(absl::InvalidArgumentError("--model DIR is required"));
  if (absl::GetFlag(FLAGS_memory).empty()) {
    return PlanFail(absl::InvalidArgumentError("--memory BYTES is required (e.g. 16G)"));
  }
  auto memory = ParseBytes("--memory", absl::GetFlag(FLAGS_memory));
  if (!memory.ok()) return PlanFail(memory.status());
  auto engine = EngineOptionsFromFlags();
  if (!engine.ok()) return PlanFail(engine.status());
  auto load = ModelLoadOptionsFromFlags();
  if (!load.ok()) return PlanFail(load.status());
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return PlanFail(config.status());
  const bool gpu = DeviceFromFlags().starts_with("cuda");
  MemoryPlanOptions o;
  o.memory = *memory;
  o.quantization = load->quantization;
  o.quantize_lm_head = load->quantize_lm_head;
  // As LlamaModel::KvCacheDType and the engine's defaults resolve "auto" and 0.
  o.kv_dtype = engine->kv_cache_dtype.value_or(
      gpu && config->torch_dtype != DType::kF32 ? config->torch_dtype : DType::kF32);
  // What the device's backend keeps (KvCacheStorage::Create refuses the others at start).
  if (!gpu && o.kv_dtype == DType::kF8E4M3) {
    return PlanFail(
        absl::InvalidArgumentError("--kv-cache-dtype fp8: fp8 is CUDA's (--device cuda)"));
  }
  o.block_size = engine->block_size;
  o.max_model_len = engine->scheduler.max_model_len;
  o.max_num_seqs = engine->scheduler.max_num_seqs;
  o.max_num_batched_tokens = engine->scheduler.max_num_batched_tokens;
  auto plan = PlanMemory(dir, o);
  if (!plan.ok()) return PlanFail(plan.status());
  const MemoryPlan& p = *plan;
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::ordered_json j;
    j["weight_bytes"] = p.weight_bytes;
    j["stored_weight_bytes"] = p.stored_weight_bytes;
    j["kv_bytes_per_token"] = p.kv_bytes_per_token;
    j["activation_reserve_bytes"] = p.activation_reserve_bytes;
    j["kv_cache_bytes"] = p.kv_cache_bytes;
    j["num_blocks"] = p.num_blocks;
    j["kv_tokens"] = p.kv_tokens;
    j["max_model_len"] = p.max_model_len;
    j["max_concurrent_sequences"] = p.max_concurrent_sequences;
    j["sequences_by_length"] = nlohmann::json::array();
    for (const auto& [len, n] : p.sequences_by_length) {
      j["sequences_by_length"].push_back({{"length", len}, {"sequences", n}});
    }
    j["quantization"] = std::string(QuantTypeName(o.quantization));
    j["quantize_lm_head"] = o.quantize_lm_head;
    j["kv_cache_dtype"] = std::string(DTypeName(o.kv_dtype));
    j["block_size"] = o.block_size;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  const ModelConfig& c = *config;
  std::printf("%s (%s), --quantization %s, KV cache %s in blocks of %lld tokens, --memory %s\n",
              dir.c_str(), c.architecture.c_str(),
              std::string(QuantTypeName(o.quantization)).c_str(),
              std::string(DTypeName(o.kv_dtype)).c_str(), static_cast<long long>(o.block_size),
              Mib(o.memory).c_str());
  std::printf("  weights             %14lld bytes (%s; %lld as stored)\n",
              static_cast<long long>(p.weight_bytes), Mib(p.weight_bytes).c_str(),
              static_cast<long long>(p.stored_weight_bytes));
  std::printf(
      "  KV per token        %14lld bytes (2 x %lld layers x %lld KV heads x %s)\n",
      static_cast<long long>(p.kv_bytes_per_token), static_cast<long long>(c.num_hidden_layers),
      static_cast<long long>(c.num_key_value_heads),
      o.kv_dtype == DType::kI8 ? absl::StrCat("(", c.head_dim, " x 1 + a 4-byte scale)").c_str()
                               : absl::StrCat(c.head_dim, " x ", DTypeSize(o.kv_dtype)).c_str());
  std::printf("  activation reserve  %14lld bytes (%s; a step of %lld tokens, estimated)\n",
              static_cast<long long>(p.activation_reserve_bytes),
              Mib(p.activation_reserve_bytes).c_str(),
              static_cast<long long>(o.max_num_batched_tokens));
  std::printf("  KV cache            %14lld bytes (%s) = %lld blocks = %lld tokens\n",
              static_cast<long long>(p.kv_cache_bytes), Mib(p.kv_cache_bytes).c_str(),
              static_cast<long long>(p.num_blocks), static_cast<long long>(p.kv_tokens));
  std::printf("  sequences at once:");
  for (const auto& [len, n] : p.sequences_by_length) {
    std::printf(" %lld of %lld tokens;", static_cast<long long>(n), static_cast<long long>(len));
  }
  std::printf("\n  a worker given --kv-cache-memory=%lld with these flags allocates this pool%s\n",
              static_cast<long long>(p.kv_cache_bytes),
              gpu ? " (on a GPU, --gpu-memory-utilization profiles the activations instead)" : "");
  return 0;
}

}  // namespace tandem::cli
