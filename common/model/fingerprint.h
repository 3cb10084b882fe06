// A model's identity for the processes that must agree on it (router, prefill and decode workers,
// the KV-transfer handshake): a hash of config.json and of every tensor's name, dtype and shape.
// Computed from the headers only (no weights are read), so the router can compute it cheaply.
// Stable across processes and machines (FNV-1a, not a salted hash).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tandem {

// The name a model directory goes by (ListModels, the `model` metric label): its last path
// component, trailing slashes ignored ("models/kjv-target/" → "kjv-target").
std::string ModelDirName(const std::string& model_dir);

// 32 hex digits. NOT_FOUND / INVALID_ARGUMENT as Checkpoint::Open reports them.
absl::StatusOr<std::string> ModelFingerprint(const std::string& model_dir);

}  // namespace tandem
