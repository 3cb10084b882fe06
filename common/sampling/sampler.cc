#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>

#include "common/base/logging.h"

namespace tandem {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Orders token ids most likely first; equal logits put the lower id first.
struct MoreLikely {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// The lowest id among the largest logits; NaN never wins; 0 when nothing beats -inf.
int32_t Argmax(const float* logits, int64_t n) {
  int32_t best = 0;
  float best_logit = kNegInf;
  for (int64_t i = 0; i < n; ++i) {
    if (logits[i] > best_logit) {
      best_logit = logits[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

uint64_t RandomSeed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

LogprobEntry ComputeLogprobs(const float* logits, int64_t vocab_size, int32_t token, int32_t top_k) {
  double max_logit = -INFINITY;
  for (int64_t i = 0; i < vocab_size; ++i) max_logit = std::max<double>(max_logit, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab_size; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double log_z = max_logit + std::log(sum);
  LogprobEntry e;
  e.token_id = token;
  e.logprob = static_cast<float>(logits[token] - log_z);
  e.rank = 1;
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (logits[i] > logits[token] || (logits[i] == logits[token] && i < token)) ++e.rank;
  }
  const int64_t k = std::min<int64_t>(std::max(top_k, 0), vocab_size);
  if (k > 0) {
    std::vector<int32_t> ids(vocab_size);
    for (int64_t i = 0; i < vocab_size; ++i) ids[i] = static_cast<int32_t>(i);
    auto better = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), better);
    e.top.reserve(k);
    for (int64_t i = 0; i < k; ++i) {
      e.top.push_back({ids[i], static_cast<float>(logits[ids[i]] - log_z)});
    }
  }
  return e;
}

SequenceSampler::SequenceSampler(const SamplingParams& params,
                                 std::span<const int32_t> prompt_token_ids, int64_t vocab_size,
                                 std::vector<int32_t> eos_token_ids)
    : params_(params),
      vocab_size_(vocab_size),
      rng_(params.seed.has_value() ? *params.seed : RandomSeed()) {
  auto in_vocab = [vocab_size](int32_t t) { return t >= 0 && t < vocab_size; };
  for (int32_t t : eos_token_ids) {
    if (in_vocab(t)) eos_token_ids_.push_back(t);
  }
  if (params_.min_tokens > 0) {
    if (!params_.ignore_eos) min_tokens_mask_ = eos_token_ids_;
    for (int32_t t : params_.stop_token_ids) {
      if (in_vocab(t)) min_tokens_mask_.push_back(t);
    }
  }
  if (params_.repetition_penalty != 1.f) {
    for (int32_t t : prompt_token_ids) {
      if (in_vocab(t)) seen_tokens_.insert(t);
    }
  }
}

int32_t SequenceSampler::Sample(std::span<const float> logits) {
  return Sample(logits, own_workspace_);
}

int32_t SequenceSampler::Sample(std::span<const float> logits, SamplingWorkspace& ws) {
  if (static_cast<int64_t>(logits.size()) != vocab_size_) {
    TANDEM_LOG(ERROR) << "SequenceSampler::Sample: " << logits.size()
                      << " logits for a vocabulary of " << vocab_size_;
    std::abort();
  }
  // top_k = 1 keeps only the argmax: the same token as greedy, without a draw.
  const bool greedy = params_.greedy() || params_.top_k == 1;
  if (greedy && !HasLogitsProcessors()) return Argmax(logits.data(), vocab_size_);
  // NaN becomes -inf so that it is never chosen and the orderings below stay strict weak orders.
  ws.logits_.resize(vocab_size_);
  std::transform(logits.begin(), logits.end(), ws.logits_.begin(),
                 [](float x) { return std::isnan(x) ? kNegInf : x; });
  ApplyLogitsProcessors(ws.logits_.data());
  if (greedy) return Argmax(ws.logits_.data(), vocab_size_);
  return SampleFromProcessed(ws);
}

bool SequenceSampler::HasLogitsProcessors() const {
  return (num_generated_ < params_.min_tokens && !min_tokens_mask_.empty()) ||
         !params_.logit_bias.empty() || !seen_tokens_.empty() || !output_counts_.empty();
}

void SequenceSampler::ApplyLogitsProcessors(float* logits) const {
  if (num_generated_ < params_.min_tokens) {
    for (int32_t t : min_tokens_mask_) logits[t] = kNegInf;
  }
  for (const LogitBias& b : params_.logit_bias) {
    if (b.token_id >= 0 && b.token_id < vocab_size_) logits[b.token_id] += b.bias;
  }
  const float repetition = params_.repetition_penalty;
  for (int32_t t : seen_tokens_) {
    logits[t] = logits[t] > 0.f ? logits[t] / repetition : logits[t] * repetition;
  }
  for (const auto& [t, count] : output_counts_) {
    logits[t] -= params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
  }
}

int32_t SequenceSampler::SampleFromProcessed(SamplingWorkspace& ws) {
  const float* logits = ws.logits_.data();
  const int32_t best = Argmax(logits, vocab_size_);
  const float max_logit = logits[best];
  // All masked, or an infinite logit: there is nothing to weigh.
  if (!std::isfinite(max_logit)) return best;
  const float inv_temperature = 1.f / params_.temperature;
  // Probability relative to the most likely token's, in (0, 1].
  auto weight = [&](int32_t t) { return std::exp((logits[t] - max_logit) * inv_temperature); };
  const MoreLikely more_likely{logits};

  // Candidates are ids[0, n); ids[0, sorted_end) are the most likely ones, in order.
  std::vector<int32_t>& ids = ws.ids_;
  ids.resize(vocab_size_);
  std::iota(ids.begin(), ids.end(), 0);
  size_t n = ids.size();
  size_t sorted_end = 0;
  if (params_.top_k > 0 && params_.top_k < vocab_size_) {
    n = static_cast<size_t>(params_.top_k);
    std::nth_element(ids.begin(), ids.begin() + n, ids.end(), more_likely);
    std::sort(ids.begin(), ids.begin() + n, more_likely);
    sorted_end = n;
  }

  if (params_.top_p < 1.f) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += weight(ids[i]);
    const double target = static_cast<double>(params_.top_p) * total;
    // Sorts only as far as the kept mass needs: chunks of the most likely remaining candidates,
    // doubling in size, so a peaked distribution never pays for a full sort of the vocabulary.
    double cumulative = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i == sorted_end) {
        const size_t end = std::min(n, std::max<size_t>(2 * sorted_end, 256));
        if (end < n) {
          std::nth_element(ids.begin() + sorted_end, ids.begin() + end, ids.begin() + n,
                           more_likely);
        }
        std::sort(ids.begin() + sorted_end, ids.begin() + end, more_likely);
        sorted_end = end;
      }
      cumulative += weight(ids[i]);
      if (cumulative >= target) {
        n = i + 1;
        break;
      }
    }
  }

  // min_p, then one draw. The most likely token is always a candidate with weight 1 >= min_p, so
  // the sum is at least 1.
  std::vector<float>& weights = ws.weights_;
  weights.resize(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float w = weight(ids[i]);
    weights[i] = w < params_.min_p ? 0.f : w;
    sum += weights[i];
  }
  const double r = NextUniform() * sum;
  double cumulative = 0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += weights[i];
    if (r < cumulative) return ids[i];
  }
  // Rounding left r at the very top: the last candidate that has any weight.
  for (size_t i = n; i-- > 0;) {
    if (weights[i] > 0.f) return ids[i];
  }
  return best;
}

void SequenceSampler::Accept(int32_t token) {
  ++num_generated_;
  if (token < 0 || token >= vocab_size_) return;
  if (params_.repetition_penalty != 1.f) seen_tokens_.insert(token);
  if (params_.frequency_penalty != 0.f || params_.presence_penalty != 0.f) ++output_counts_[token];
}

bool SequenceSampler::IsStop(int32_t token, int32_t num_generated) const {
  if (num_generated < params_.min_tokens) return false;
  if (!params_.ignore_eos &&
      std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end()) {
    return true;
  }
  return std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) !=
         params_.stop_token_ids.end();
}

}  // namespace tandem
