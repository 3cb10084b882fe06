// A large model that computes exactly what a small one does (`tandem make-model --pad-from`): a
// benchmark target bound by memory bandwidth as a real model is, with the small model's real
// predictions (a trained target keeps its draft's acceptance rate). The MLP widens with neurons
// whose down_proj columns are zero (their gate and up rows repeat the model's own, so they cost
// what real neurons cost and stay finite), and layers are appended whose o_proj and down_proj are
// zero (the last layer's other weights: real attention and MLP work whose outputs add zero to the
// residual stream). The padded model's logits equal the small model's up to the rounding of sums
// that grew longer by zeros (tests/unit/pad_model_test.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"

namespace tandem {

struct PadModelOptions {
  std::string from_dir;           // a Llama-family checkpoint directory
  std::string out_dir;            // written (created if absent); must not be from_dir
  int64_t intermediate_size = 0;  // the MLP width, >= the model's (0: the model's)
  int64_t extra_layers = 0;       // layers appended, >= 0
  uint64_t max_shard_bytes = 2ull << 30;
  std::function<void(uint64_t, uint64_t)> progress;  // (bytes written, total)
};

// INVALID_ARGUMENT for a narrower MLP, negative layers, out_dir == from_dir, or a width or depth
// past config.json's limits; the loader's errors for an unreadable model.
absl::Status PadModel(const PadModelOptions& options);

}  // namespace tandem
