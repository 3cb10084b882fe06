// Sampling where the logits are: the kernels behind DeviceSampler::TopKRows, ApplyLogitEdits and
// SampleRows (common/sampling/device_sampling.h describes what the host asks of them). One block
// per row; a row's result depends on that row alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/sampling/device_sampling.h"

namespace tandem::cuda {

// Largest k LaunchTopKRows selects (its in-block sort holds this many).
constexpr int32_t kMaxTopK = 256;

// ids[i][0..row_k[i]) and values[i][0..row_k[i]) = row i's most likely entries of x[n][d], most
// likely first, the lower id first among equal values (-0 equal to +0), NaN counted as -inf (and
// given as -inf): the sampler's SelectTopK order. row_k [n] device (nullable: k for every row); a
// row whose k is 0 is skipped. A radix select of the k-th key (four 8-bit passes over the row), one
// pass gathering the keys above it and the lowest ids equal to it, then a bitonic sort of at most
// kMaxTopK. cudaErrorInvalidValue for k outside [1, min(d, kMaxTopK)].
cudaError_t LaunchTopKRows(const float* x, int64_t n, int64_t d, int32_t k, const int32_t* row_k,
                           int32_t* ids, float* values, cudaStream_t stream);

// logits[e.row][e.token] = ApplyLogitEdit(that, e) for each of edits[count] (device; one per row
// and token): one thread an edit.
cudaError_t LaunchApplyLogitEdits(float* logits, int64_t d, const LogitEdit* edits, int64_t count,
                                  cudaStream_t stream);

// Per row of logits[n][d], RowDraw draws[i] (device): the weight total (kTotal, into totals[i]) or
// the drawn token (kDraw, into tokens[i]) as common/sampling's RowWeightTotal and DrawFromRow
// define them. Each warp takes a contiguous eighth of the row and sums its weights 32 at a time (an
// inclusive warp scan, in double); the draw finds the warp whose span holds u × sum, and that warp
// rescans its span for the token. Differs from the host's sequential sums only in rounding.
cudaError_t LaunchSampleRows(const float* logits, int64_t n, int64_t d, const RowDraw* draws,
                             int32_t* tokens, double* totals, cudaStream_t stream);

}  // namespace tandem::cuda
