#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status SamplingParams::Validate(int64_t vocab_size) const {
  if (!(temperature >= 0.f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0.f && top_p <= 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 0, got ", max_tokens));
  }
  if (logprobs < -1 || logprobs > vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs must be in [0, vocab_size=", vocab_size, "], got ", logprobs));
  }
  if (prompt_logprobs < -1 || prompt_logprobs > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt_logprobs must be in [0, vocab_size=", vocab_size, "], got ", prompt_logprobs));
  }
  for (int32_t t : stop_token_ids) {
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("stop token id ", t, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

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

int32_t Sampler::Sample(const float* logits, int64_t vocab_size, const SamplingParams& p) {
  if (p.temperature == 0.f || p.top_k == 1) {
    int32_t best = 0;
    for (int64_t i = 1; i < vocab_size; ++i) {
      if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
    }
    return best;
  }
  candidates_.clear();
  for (int64_t i = 0; i < vocab_size; ++i) {
    candidates_.emplace_back(logits[i] / p.temperature, static_cast<int32_t>(i));
  }
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < keep) {
    keep = p.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);
  const float max_logit = candidates_[0].first;
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += probs[i] = std::exp(candidates_[i].first - max_logit);
  if (p.top_p < 1.f) {
    double cumulative = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i] / sum;
      if (cumulative >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += probs[i];
  }
  const double r = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (r < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace tandem
