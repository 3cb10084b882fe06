#include "cli/checkpoint_writer.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/tensor/safetensors.h"
#include "nlohmann/json.hpp"

namespace tandem {

namespace fs = std::filesystem;
using nlohmann::json;

uint64_t TensorSpec::bytes() const {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

absl::Status CopyTokenizerFiles(const std::string& from_dir, const std::string& out_dir) {
  auto copied = [](const std::string& name) {
    return name.starts_with("tokenizer") || name == "generation_config.json" ||
           name == "special_tokens_map.json" || name == "vocab.json" || name == "merges.txt" ||
           name == "chat_template.jinja" || name == "chat_template.json";
  };
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(from_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !copied(name)) continue;
    fs::copy_file(entry.path(), fs::path(out_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", name, ": ", ec.message()));
  }
  if (ec) return absl::InternalError(absl::StrCat(from_dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::Status WriteCheckpointWeights(const std::string& dir_name,
                                    const std::vector<TensorSpec>& tensors,
                                    uint64_t max_shard_bytes,
                                    const std::function<void(uint64_t, uint64_t)>& progress) {
  const fs::path dir(dir_name);
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t b = tensors[i].bytes();
    if (shard_bytes > 0 && shard_bytes + b > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += b;
    total_bytes += b;
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors") || name == "model.safetensors.index.json") {
      fs::remove(entry.path(), ec);
    }
  }
  json weight_map = json::object();
  uint64_t written = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : absl::StrFormat("model-%05d-of-%05d.safetensors",
                                                                  s + 1, shards.size());
    std::vector<TensorToWrite> out;
    for (size_t i : shards[s]) {
      const TensorSpec& spec = tensors[i];
      TensorToWrite t;
      t.name = spec.name;
      t.dtype = spec.dtype;
      t.shape = spec.shape;
      t.data.resize(spec.bytes());
      spec.fill(t.data.data());
      written += t.data.size();
      if (progress) progress(written, total_bytes);
      weight_map[spec.name] = file;
      out.push_back(std::move(t));
    }
    RETURN_IF_ERROR(WriteSafetensors((dir / file).string(), out, {{"format", "pt"}}));
  }
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    RETURN_IF_ERROR(
        WriteTextFile((dir / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
