// Sampling and log-probabilities where the logits are (Backend::sampler(): the CUDA backend's;
// elsewhere the rows go to the host). The ops serve SequenceSampler's DeviceSamplingPlan and the
// model runner's logprobs; every array is a device array of the backend that returned it.
#pragma once

#include <cstdint>

#include "common/sampling/device_sampling.h"

namespace tandem {

class DeviceSampler {
 public:
  virtual ~DeviceSampler() = default;

  // Whether TopKRows, ApplyLogitEdits and SampleRows run.
  virtual bool SupportsSampling() const { return false; }
  // Top-k candidates: ids[i][0..k) and values[i][0..k) = row i's k largest values of x[n][d],
  // largest first, the lower id first among equal values, NaN counted as -inf: the sampler's
  // SelectTopK, whose result SequenceSampler::SampleFromTopK finishes exactly. `row_k` [n]
  // (nullable): rows whose entry is 0 are skipped (their outputs left as they were).
  virtual void TopKRows(const float* /*x*/, int64_t /*n*/, int64_t /*d*/, int32_t /*k*/,
                        const int32_t* /*row_k*/, int32_t* /*ids*/, float* /*values*/) {}
  // logits[e.row][e.token] = ApplyLogitEdit(that logit, e) for every e of edits[count] (at most one
  // edit per row and token): a step's logits processors, bit-identical to the host sampler's.
  virtual void ApplyLogitEdits(float* /*logits*/, int64_t /*d*/, const LogitEdit* /*edits*/,
                               int64_t /*count*/) {}
  // Per row i of logits[n][d], as draws[i] says (RowDraw): kTotal → totals[i] = RowWeightTotal's
  // sum; kDraw → tokens[i] = DrawFromRow's token; kNone → nothing. Equal to the host definitions
  // (in common/sampling/sampler.h) up to the rounding of exp and of the order of the sums.
  virtual void SampleRows(const float* /*logits*/, int64_t /*n*/, int64_t /*d*/,
                          const RowDraw* /*draws*/, int32_t* /*tokens*/, double* /*totals*/) {}

  // Whether Logprobs runs.
  virtual bool SupportsLogprobs() const { return false; }
  // Log-probabilities as common/sampling's ComputeLogprobs gives them to rounding (log-softmax with
  // the normaliser summed in double): for row i of logits[n][d], token_out[i] = tokens[i], or the
  // row's argmax (Backend::ArgmaxRows' choice) when tokens[i] is -1; logprob[i] and rank[i]
  // (1-based, equal logits rank the lower id first) of that token; and the top_k most likely ids
  // and logprobs, most likely first, top_ids/top_logprobs[n][top_k]. Rows whose token is -2 are
  // skipped.
  virtual void Logprobs(const float* /*logits*/, int64_t /*n*/, int64_t /*d*/,
                        const int32_t* /*tokens*/, int32_t /*top_k*/, int32_t* /*token_out*/,
                        float* /*logprob*/, int32_t* /*rank*/, int32_t* /*top_ids*/,
                        float* /*top_logprobs*/) {}
};

}  // namespace tandem
