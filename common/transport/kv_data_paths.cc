#include "common/transport/kv_data_paths.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/transport/cuda_ipc/cuda_ipc_kv_link.h"
#include "common/transport/nccl/nccl_kv_link.h"

namespace tandem {

absl::StatusOr<std::vector<std::string>> ParseKvTransports(const std::string& value) {
  std::vector<std::string> names;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    const std::string name(part);
    if (name != "tcp" && name != "nccl" && name != "cuda-ipc") {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-transport: '", name, "' is not tcp, nccl or cuda-ipc (",
                       "a comma-separated list of them, in the order to try)"));
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-transport names '", name, "' twice"));
    }
    if (!names.empty() && names.back() == "tcp") {
      return absl::InvalidArgumentError(absl::StrCat("--kv-transport: '", name,
                                                     "' comes after tcp, which always "
                                                     "works, so it would never be tried"));
    }
    names.push_back(name);
  }
  return names;
}

absl::StatusOr<std::unique_ptr<KvLinkFactory>> CreateKvLinkFactory(const std::string& name,
                                                                   KvCacheStorage* storage) {
  if (name == "nccl") return CreateNcclKvLinkFactory(storage);
  if (name == "cuda-ipc") return CreateCudaIpcKvLinkFactory(storage);
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is not a KV side link (nccl or cuda-ipc)"));
}

absl::StatusOr<KvDataPaths> KvDataPaths::Create(const std::vector<std::string>& names,
                                                KvCacheStorage* storage) {
  KvDataPaths p;
  for (const std::string& name : names) {
    if (name == "tcp") {
      p.order_.push_back(nullptr);
      continue;
    }
    absl::StatusOr<std::unique_ptr<KvLinkFactory>> f = CreateKvLinkFactory(name, storage);
    if (!f.ok()) return f.status();
    p.order_.push_back(f->get());
    p.owned_.push_back(*std::move(f));
  }
  return p;
}

std::vector<KvLinkFactory*> KvDataPaths::links() const {
  std::vector<KvLinkFactory*> out;
  for (const auto& f : owned_) out.push_back(f.get());
  return out;
}

int64_t KvDataPaths::live_links() const {
  int64_t n = 0;
  for (const auto& f : owned_) n += f->live_links();
  return n;
}

std::string KvDataPaths::Describe() const {
  std::vector<std::string> names;
  for (KvLinkFactory* f : order_) names.push_back(f != nullptr ? f->name() : "inline");
  return absl::StrJoin(names, ", then ");
}

}  // namespace tandem
