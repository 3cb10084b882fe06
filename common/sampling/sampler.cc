#include "common/sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>

#include "common/base/argmax.h"
#include "common/base/logging.h"

namespace tandem {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Loops over the vocabulary work in blocks of this many tokens, a fixed trip count the compiler
// turns into packed instructions (a plain loop of unknown length stays scalar at -O2).
constexpr int kBlock = 8;

// Orders token ids most likely first; equal logits put the lower id first.
struct MoreLikely {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// ids = the k most likely tokens, most likely first: one pass with a heap whose front is the least
// likely token kept, so most tokens cost a single comparison.
void SelectTopK(const float* logits, int64_t n, int64_t k, std::vector<int32_t>& ids) {
  const MoreLikely more_likely{logits};
  ids.resize(k);
  std::iota(ids.begin(), ids.end(), 0);
  std::make_heap(ids.begin(), ids.end(), more_likely);
  // Tokens are visited in increasing id order, so a later token ties with the heap's front only
  // by losing: it enters exactly when its logit is strictly above the front's.
  float floor_logit = logits[ids.front()];
  auto visit = [&](int64_t t) {
    if (!(logits[t] > floor_logit)) return;
    std::pop_heap(ids.begin(), ids.end(), more_likely);
    ids.back() = static_cast<int32_t>(t);
    std::push_heap(ids.begin(), ids.end(), more_likely);
    floor_logit = logits[ids.front()];
  };
  int64_t t = k;
  // Most spans of kSpan tokens hold no candidate: their packed maxima rule them out at once.
  constexpr int kSpan = 8 * kBlock;
  for (; t + kSpan <= n; t += kSpan) {
    float lanes[kBlock];
    std::fill(lanes, lanes + kBlock, kNegInf);
    for (int b = 0; b < kSpan; b += kBlock) {
      for (int j = 0; j < kBlock; ++j) {
        lanes[j] = logits[t + b + j] > lanes[j] ? logits[t + b + j] : lanes[j];
      }
    }
    if (*std::max_element(lanes, lanes + kBlock) > floor_logit) {
      for (int j = 0; j < kSpan; ++j) visit(t + j);
    }
  }
  for (; t < n; ++t) visit(t);
  std::sort_heap(ids.begin(), ids.end(), more_likely);
}

// Weights in [0, 1] by the top 13 bits of their representation, which order like the weights.
constexpr int kNumWeightBuckets = (std::bit_cast<uint32_t>(1.0f) >> 19) + 1;
int WeightBucket(float weight) {
  return std::min(static_cast<int>(std::bit_cast<uint32_t>(weight) >> 19), kNumWeightBuckets - 1);
}

void CopyReplacingNaN(const float* __restrict in, int64_t n, float* __restrict out) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (int j = 0; j < kBlock; ++j) out[i + j] = in[i + j] > kNegInf ? in[i + j] : kNegInf;
  }
  for (; i < n; ++i) out[i] = in[i] > kNegInf ? in[i] : kNegInf;
}

// The draw over candidates 0..n-1 (token candidate(i), weight weights[candidate(i)]): weights below
// min_p are zeroed, then the first candidate whose running sum exceeds u × the sum. The most likely
// token is always a candidate, with weight 1 >= min_p, so the sum is at least 1; `fallback` is for
// a sum of no weight at all.
template <typename Candidate>
int32_t DrawAmong(size_t n, Candidate candidate, float* weights, float min_p, double u,
                  int32_t fallback) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    float& w = weights[candidate(i)];
    if (w < min_p) w = 0.f;
    sum += w;
  }
  const double r = u * sum;
  double cumulative = 0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += weights[candidate(i)];
    if (r < cumulative) return candidate(i);
  }
  // Rounding left r at the very top: the last candidate that has any weight.
  for (size_t i = n; i-- > 0;) {
    if (weights[candidate(i)] > 0.f) return candidate(i);
  }
  return fallback;
}

// exp((logit - max) × inv_temperature); NaN weighs 0 (on a processed row there is none).
inline float Weight(float logit, float max_logit, float inv_temperature) {
  return std::isnan(logit) ? 0.f : std::exp((logit - max_logit) * inv_temperature);
}

uint64_t RandomSeed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

int32_t DrawFromRow(const float* logits, int64_t vocab, float inv_temperature, float min_p,
                    double u, float* weights) {
  const int32_t best = ArgmaxRow(logits, vocab);
  const float max_logit = logits[best];
  // All masked, or an infinite logit: there is nothing to weigh.
  if (!std::isfinite(max_logit)) return best;
  for (int64_t t = 0; t < vocab; ++t) weights[t] = Weight(logits[t], max_logit, inv_temperature);
  return DrawAmong(
      static_cast<size_t>(vocab), [](size_t i) { return static_cast<int32_t>(i); }, weights, min_p,
      u, best);
}

double RowWeightTotal(const float* logits, int64_t vocab, float inv_temperature) {
  const float max_logit = logits[ArgmaxRow(logits, vocab)];
  if (!std::isfinite(max_logit)) return 0;
  double total = 0;
  for (int64_t t = 0; t < vocab; ++t) total += Weight(logits[t], max_logit, inv_temperature);
  return total;
}

LogprobEntry ComputeLogprobs(const float* logits, int64_t vocab_size, int32_t token,
                             int32_t top_k) {
  double max_logit = -INFINITY;
  for (int64_t i = 0; i < vocab_size; ++i) max_logit = std::max<double>(max_logit, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab_size; ++i) {
    sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  }
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
  return SampleRow(logits, ws, /*apply_processors=*/true);
}

int32_t SequenceSampler::SampleProcessed(std::span<const float> processed, SamplingWorkspace& ws) {
  return SampleRow(processed, ws, /*apply_processors=*/false);
}

int32_t SequenceSampler::SampleRow(std::span<const float> logits, SamplingWorkspace& ws,
                                   bool apply_processors) {
  if (static_cast<int64_t>(logits.size()) != vocab_size_) {
    TANDEM_LOG(ERROR) << "SequenceSampler::Sample: " << logits.size()
                      << " logits for a vocabulary of " << vocab_size_;
    std::abort();
  }
  // top_k = 1 keeps only the argmax: the same token as greedy, without a draw.
  const bool greedy = params_.greedy() || params_.top_k == 1;
  if (greedy && (!apply_processors || !HasLogitsProcessors()))
    return ArgmaxRow(logits.data(), vocab_size_);
  // NaN becomes -inf so that it is never chosen and the orderings below stay strict weak orders.
  ws.logits_.resize(vocab_size_);
  CopyReplacingNaN(logits.data(), vocab_size_, ws.logits_.data());
  if (apply_processors) ApplyLogitsProcessors(ws.logits_.data());
  if (greedy) return ArgmaxRow(ws.logits_.data(), vocab_size_);
  return SampleFromProcessed(ws);
}

bool SequenceSampler::PlainArgmax() const {
  return (params_.greedy() || params_.top_k == 1) && !HasLogitsProcessors();
}

bool SequenceSampler::HasLogitsProcessors() const {
  return (num_generated_ < params_.min_tokens && !min_tokens_mask_.empty()) ||
         !params_.logit_bias.empty() || !seen_tokens_.empty() || !output_counts_.empty() ||
         constraint_ != nullptr;
}

void SequenceSampler::set_constraint(std::unique_ptr<TokenConstraint> constraint) {
  constraint_ = std::move(constraint);
  allowed_current_ = false;
}

void SequenceSampler::ApplyLogitsProcessors(float* logits) const {
  if (constraint_ != nullptr) {
    if (!allowed_current_) {
      constraint_->AllowedTokens(&allowed_);
      allowed_current_ = true;
    }
    // EOS ids are not among the allowed tokens (they add no bytes): their logits are kept aside.
    eos_logits_.resize(eos_token_ids_.size());
    for (size_t i = 0; i < eos_token_ids_.size(); ++i) eos_logits_[i] = logits[eos_token_ids_[i]];
    bool any = false;
    for (int64_t t = 0; t < vocab_size_; ++t) {
      if (!((allowed_[static_cast<size_t>(t) >> 6] >> (t & 63)) & 1)) {
        logits[t] = kNegInf;
      } else {
        any = any || logits[t] != kNegInf;
      }
    }
    // EOS where the output is complete; also where nothing else is left (a vocabulary that cannot
    // continue the output ends it rather than breaking it).
    const bool end = constraint_->CanEnd() || !any;
    for (size_t i = 0; i < eos_token_ids_.size(); ++i) {
      logits[eos_token_ids_[i]] = end ? eos_logits_[i] : kNegInf;
    }
  }
  if (num_generated_ < params_.min_tokens) {
    for (int32_t t : min_tokens_mask_) logits[t] = kNegInf;
  }
  for (const LogitBias& b : params_.logit_bias) {
    if (b.token_id >= 0 && b.token_id < vocab_size_) logits[b.token_id] += b.bias;
  }
  const float repetition = params_.repetition_penalty;
  for (int32_t t : seen_tokens_) logits[t] = PenalizeRepetition(logits[t], repetition);
  for (const auto& [t, count] : output_counts_) logits[t] -= PenaltySubtraction(count);
}

void SequenceSampler::AppendLogitEdits(int32_t row, std::vector<LogitEdit>* edits) const {
  absl::flat_hash_map<int32_t, LogitEdit> by_token;
  auto at = [&](int32_t t) -> LogitEdit& {
    auto [it, inserted] = by_token.try_emplace(t);
    if (inserted) {
      it->second.row = row;
      it->second.token = t;
    }
    return it->second;
  };
  if (num_generated_ < params_.min_tokens) {
    for (int32_t t : min_tokens_mask_) at(t).flags |= LogitEdit::kMask;
  }
  for (const LogitBias& b : params_.logit_bias) {
    if (b.token_id < 0 || b.token_id >= vocab_size_) continue;
    LogitEdit& e = at(b.token_id);
    e.flags |= LogitEdit::kBias;
    e.bias = b.bias;
  }
  for (int32_t t : seen_tokens_) {
    LogitEdit& e = at(t);
    e.flags |= LogitEdit::kRepeat;
    e.repetition = params_.repetition_penalty;
  }
  for (const auto& [t, count] : output_counts_) {
    LogitEdit& e = at(t);
    e.flags |= LogitEdit::kSubtract;
    e.subtract = PenaltySubtraction(count);
  }
  edits->reserve(edits->size() + by_token.size());
  for (const auto& [t, e] : by_token) edits->push_back(e);
}

DeviceSamplingPlan SequenceSampler::DevicePlan(int32_t max_k) const {
  using Kind = DeviceSamplingPlan::Kind;
  if (constraint_ != nullptr) return {};  // the mask is the whole row: sampled on the host
  const bool edits = HasLogitsProcessors();
  if (params_.greedy() || params_.top_k == 1) return {Kind::kArgmax, 0, edits};
  if (params_.top_k > 0 && params_.top_k < vocab_size_) {
    return params_.top_k <= max_k ? DeviceSamplingPlan{Kind::kTopK, params_.top_k, edits}
                                  : DeviceSamplingPlan{};
  }
  if (params_.top_p < 1.f) {
    const int32_t k = static_cast<int32_t>(std::min<int64_t>(max_k, vocab_size_));
    return k > 1 ? DeviceSamplingPlan{Kind::kNucleus, k, edits} : DeviceSamplingPlan{};
  }
  return {Kind::kDraw, 0, edits};
}

double SequenceSampler::DrawForDevice() {
  if (DevicePlan(0).kind != DeviceSamplingPlan::Kind::kDraw) {
    TANDEM_LOG(ERROR) << "SequenceSampler::DrawForDevice: the step is not a whole-row draw";
    std::abort();
  }
  return NextUniform();
}

int32_t SequenceSampler::SampleFromTopK(std::span<const int32_t> ids, std::span<const float> logits,
                                        SamplingWorkspace& ws) {
  const DeviceSamplingPlan plan = DevicePlan(static_cast<int32_t>(ids.size()));
  const int32_t k = plan.k;
  if (plan.kind != DeviceSamplingPlan::Kind::kTopK || logits.size() < ids.size()) {
    TANDEM_LOG(ERROR) << "SequenceSampler::SampleFromTopK: " << ids.size()
                      << " candidates for top_k " << params_.top_k;
    std::abort();
  }
  // Only the candidates' entries of the processed row are read on the top-k path.
  ws.logits_.resize(vocab_size_);
  for (int32_t i = 0; i < k; ++i) ws.logits_[ids[i]] = std::isnan(logits[i]) ? kNegInf : logits[i];
  const std::vector<int32_t> selected(ids.begin(), ids.begin() + k);
  return SampleFromProcessed(ws, &selected);
}

std::optional<int32_t> SequenceSampler::SampleFromNucleus(std::span<const int32_t> ids,
                                                          std::span<const float> logits,
                                                          double total, SamplingWorkspace& ws) {
  const DeviceSamplingPlan plan = DevicePlan(static_cast<int32_t>(ids.size()));
  if (plan.kind != DeviceSamplingPlan::Kind::kNucleus || ids.empty() ||
      logits.size() < ids.size()) {
    TANDEM_LOG(ERROR) << "SequenceSampler::SampleFromNucleus: " << ids.size()
                      << " candidates for a top_p step";
    std::abort();
  }
  const size_t n = ids.size();
  const int32_t best = ids[0];
  const float max_logit = std::isnan(logits[0]) ? kNegInf : logits[0];
  if (!std::isfinite(max_logit)) {
    NextUniform();  // Sample() draws before it finds nothing to weigh
    return best;
  }
  ws.weights_.resize(vocab_size_);
  float* weights = ws.weights_.data();
  // The nucleus, most likely first: candidates until their weights reach the target.
  const double target = static_cast<double>(params_.top_p) * total;
  double cumulative = 0;
  size_t m = n;  // candidates in the nucleus
  for (size_t i = 0; i < n; ++i) {
    cumulative += weights[ids[i]] = Weight(logits[i], max_logit, inv_temperature());
    if (cumulative >= target) {
      m = i + 1;
      break;
    }
  }
  if (cumulative < target && static_cast<int64_t>(n) < vocab_size_)
    return std::nullopt;  // wider than the candidates
  // Sample()'s order: tokens of weight buckets above the last one's by id, then the last bucket's
  // most likely first.
  const int last_bucket = WeightBucket(weights[ids[m - 1]]);
  std::vector<int32_t>& order = ws.ids_;
  order.clear();
  for (size_t i = 0; i < m; ++i) {
    if (WeightBucket(weights[ids[i]]) > last_bucket) order.push_back(ids[i]);
  }
  std::sort(order.begin(), order.end());
  for (size_t i = 0; i < m; ++i) {
    if (WeightBucket(weights[ids[i]]) == last_bucket) order.push_back(ids[i]);
  }
  const double u = NextUniform();
  return DrawAmong(
      order.size(), [&](size_t i) { return order[i]; }, weights, params_.min_p, u, best);
}

int32_t SequenceSampler::SampleFromProcessed(SamplingWorkspace& ws,
                                             const std::vector<int32_t>* top_k_ids) {
  const double u = NextUniform();  // drawn first: one draw per sampled step, whatever the path
  const Candidates c = SelectCandidates(ws, top_k_ids);
  if (c.degenerate) return c.best;
  // min_p, then one draw.
  if (c.all_tokens) {
    return DrawAmong(
        static_cast<size_t>(vocab_size_), [](size_t i) { return static_cast<int32_t>(i); },
        ws.weights_.data(), params_.min_p, u, c.best);
  }
  return DrawAmong(
      c.n, [&](size_t i) { return ws.ids_[i]; }, ws.weights_.data(), params_.min_p, u, c.best);
}

SequenceSampler::Candidates SequenceSampler::SelectCandidates(
    SamplingWorkspace& ws, const std::vector<int32_t>* top_k_ids) const {
  const float* logits = ws.logits_.data();
  const bool top_k_on = params_.top_k > 0 && params_.top_k < vocab_size_;
  ws.weights_.resize(vocab_size_);
  float* weights = ws.weights_.data();
  // SelectTopK's first is the row's argmax (the same order, the same tie rule).
  const int32_t best = top_k_ids != nullptr ? top_k_ids->front() : ArgmaxRow(logits, vocab_size_);
  const float max_logit = logits[best];
  // All masked, or an infinite logit: there is nothing to weigh.
  if (!std::isfinite(max_logit)) return {true, 0, best, true};
  // Probability relative to the most likely token's, in [0, 1].
  const float inv_t = inv_temperature();
  auto weight = [&](int64_t t) { return Weight(logits[t], max_logit, inv_t); };
  if (!top_k_on && params_.top_p >= 1.f) {
    for (int64_t t = 0; t < vocab_size_; ++t) weights[t] = weight(t);
    return {true, static_cast<size_t>(vocab_size_), best, false};
  }
  const MoreLikely more_likely{logits};

  // Candidates: every token (all_tokens) or ids[0, n). weights[t] is set for every candidate t.
  std::vector<int32_t>& ids = ws.ids_;
  bool all_tokens = true;
  size_t n = static_cast<size_t>(vocab_size_);
  double total = 0;
  if (top_k_on) {
    if (top_k_ids != nullptr) {
      ids = *top_k_ids;
    } else {
      SelectTopK(logits, vocab_size_, params_.top_k, ids);
    }
    all_tokens = false;
    n = ids.size();
    for (int32_t t : ids) total += weights[t] = weight(t);
  } else {
    for (int64_t t = 0; t < vocab_size_; ++t) total += weights[t] = weight(t);
  }
  if (params_.top_p < 1.f) {
    // The nucleus: the most likely tokens, in order, until their mass reaches the target.
    const double target = static_cast<double>(params_.top_p) * total;
    double cumulative = 0;
    std::vector<int32_t>& boundary = ws.boundary_ids_;  // decided one by one, most likely first
    if (all_tokens) {
      // No full sort: weights are bucketed by the top bits of their float representation
      // (exponent and 4 mantissa bits: buckets 2^(1/16) wide, ordered as the weights are). Summing
      // bucket masses from the heaviest finds the bucket where the target is reached: tokens in
      // heavier buckets are all in the nucleus, tokens in lighter ones are not, and only the
      // boundary bucket is sorted. (Sums are in bucket order, so a cut within rounding of the
      // target may differ from a full sort's.)
      std::vector<double>& mass = ws.bucket_mass_;
      mass.assign(kNumWeightBuckets, 0.0);
      for (int64_t t = 0; t < vocab_size_; ++t) mass[WeightBucket(weights[t])] += weights[t];
      int boundary_bucket = kNumWeightBuckets - 1;
      for (; boundary_bucket > 0; --boundary_bucket) {
        if (cumulative + mass[boundary_bucket] >= target) break;
        cumulative += mass[boundary_bucket];
      }
      ids.clear();
      boundary.clear();
      for (int32_t t = 0; t < vocab_size_; ++t) {
        const int bucket = WeightBucket(weights[t]);
        if (bucket > boundary_bucket) {
          ids.push_back(t);
        } else if (bucket == boundary_bucket) {
          boundary.push_back(t);
        }
      }
      std::sort(boundary.begin(), boundary.end(), more_likely);
      all_tokens = false;
    } else {
      boundary.swap(ids);  // top-k left them sorted
      ids.clear();
    }
    for (int32_t t : boundary) {
      ids.push_back(t);
      cumulative += weights[t];
      if (cumulative >= target) break;
    }
    n = ids.size();
  }

  return {all_tokens, n, best, false};
}

void SequenceSampler::Distribution(std::span<const float> logits, SamplingWorkspace& ws,
                                   std::vector<float>* probs) {
  if (static_cast<int64_t>(logits.size()) != vocab_size_) {
    TANDEM_LOG(ERROR) << "SequenceSampler::Distribution: " << logits.size()
                      << " logits for a vocabulary of " << vocab_size_;
    std::abort();
  }
  probs->assign(static_cast<size_t>(vocab_size_), 0.f);
  ws.logits_.resize(vocab_size_);
  CopyReplacingNaN(logits.data(), vocab_size_, ws.logits_.data());
  ApplyLogitsProcessors(ws.logits_.data());
  if (params_.greedy() || params_.top_k == 1) {
    (*probs)[ArgmaxRow(ws.logits_.data(), vocab_size_)] = 1.f;
    return;
  }
  const Candidates c = SelectCandidates(ws, nullptr);
  if (c.degenerate) {
    (*probs)[c.best] = 1.f;
    return;
  }
  // The weights DrawAmong draws from: those below min_p count 0.
  const float* weights = ws.weights_.data();
  auto id = [&](size_t i) { return c.all_tokens ? static_cast<int32_t>(i) : ws.ids_[i]; };
  double sum = 0;
  for (size_t i = 0; i < c.n; ++i) {
    const float w = weights[id(i)];
    if (!(w < params_.min_p)) sum += w;
  }
  for (size_t i = 0; i < c.n; ++i) {
    const float w = weights[id(i)];
    if (!(w < params_.min_p)) (*probs)[id(i)] = static_cast<float>(w / sum);
  }
}

std::unique_ptr<SequenceSampler> SequenceSampler::Fork(uint64_t seed) const {
  SamplingParams params = params_;
  params.seed = seed;
  auto f = std::make_unique<SequenceSampler>(params, std::span<const int32_t>(), vocab_size_,
                                             eos_token_ids_);
  f->params_.seed = params_.seed;
  f->num_generated_ = num_generated_;
  f->seen_tokens_ = seen_tokens_;
  f->output_counts_ = output_counts_;
  if (constraint_ != nullptr) f->constraint_ = constraint_->Clone();
  return f;
}

void SequenceSampler::Accept(int32_t token) {
  ++num_generated_;
  if (constraint_ != nullptr) {
    allowed_current_ = false;
    if (std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) == eos_token_ids_.end()) {
      constraint_->Accept(token);
    }
  }
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
