// The parts of sampling that run where the logits are (a GPU), described in plain structs the host
// fills and the device reads, with the arithmetic both sides share.
//
// A step's logits processors (min_tokens, logit_bias, the repetition, presence and frequency
// penalties) touch a few tokens of a row: the sampler lists them as LogitEdits, one per token with
// everything that applies to it, and the device applies them in place. ApplyLogitEdit composes the
// processors in the sampler's order with the same float operations, so an edited row is
// bit-identical to the row the host sampler processes. A RowDraw asks the device either for the
// row's softmax weight total (top-p over top-k candidates, SequenceSampler::SampleFromNucleus) or
// for the token itself (temperature and min-p sampling over the whole row,
// SequenceSampler::DrawForDevice).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem {

// Everything one step's logits processors do to one token of one row.
struct LogitEdit {
  static constexpr uint32_t kMask = 1;      // min_tokens: -inf (then nothing else matters)
  static constexpr uint32_t kBias = 2;      // logit_bias: += bias
  static constexpr uint32_t kRepeat = 4;    // repetition_penalty: positive ÷ repetition, else ×
  static constexpr uint32_t kSubtract = 8;  // presence and frequency: -= subtract
  int32_t row = 0;    // the logits row (a position in ForwardInput::logits_rows)
  int32_t token = 0;  // in [0, vocab)
  uint32_t flags = 0;
  float bias = 0.f;
  float repetition = 1.f;
  float subtract = 0.f;  // frequency × count + presence, computed by the host
};
static_assert(sizeof(LogitEdit) == 24, "LogitEdit is uploaded as is");

// The repetition penalty on one logit (vLLM's rule).
TANDEM_HOST_DEVICE inline float PenalizeRepetition(float x, float repetition) {
#if defined(__CUDA_ARCH__)
  return x > 0.f ? __fdiv_rn(x, repetition) : __fmul_rn(x, repetition);
#else
  return x > 0.f ? x / repetition : x * repetition;
#endif
}

// One token's processed logit. NaN becomes -inf first, as the host sampler's copy does. Every
// operation is rounded on its own: on the device by intrinsics, on the host by building the sampler
// with -ffp-contract=off (no fused multiply-add).
TANDEM_HOST_DEVICE inline float ApplyLogitEdit(float x, const LogitEdit& e) {
  if (x != x) x = -INFINITY;
  if (e.flags & LogitEdit::kMask) return -INFINITY;
#if defined(__CUDA_ARCH__)
  if (e.flags & LogitEdit::kBias) x = __fadd_rn(x, e.bias);
  if (e.flags & LogitEdit::kRepeat) x = PenalizeRepetition(x, e.repetition);
  if (e.flags & LogitEdit::kSubtract) x = __fsub_rn(x, e.subtract);
#else
  if (e.flags & LogitEdit::kBias) x += e.bias;
  if (e.flags & LogitEdit::kRepeat) x = PenalizeRepetition(x, e.repetition);
  if (e.flags & LogitEdit::kSubtract) x -= e.subtract;
#endif
  return x;
}

// What the device computes for one row (DeviceSampler::SampleRows). Weights are
// exp((logit - max) × inv_temperature), NaN and -inf weighing 0.
struct RowDraw {
  static constexpr int32_t kNone = 0;
  static constexpr int32_t kTotal = 1;  // totals[row] = the sum of every token's weight (double)
  static constexpr int32_t kDraw =
      2;  // tokens[row] = the first token, by id, whose running sum of
          // weights (those below min_p counted as 0) exceeds u × their sum
  int32_t mode = kNone;
  float inv_temperature = 1.f;  // 1 / temperature, in float, as the host sampler computes it
  float min_p = 0.f;
  int32_t pad = 0;
  double u = 0;  // the step's uniform draw in [0, 1)
};
static_assert(sizeof(RowDraw) == 24, "RowDraw is uploaded as is");

}  // namespace tandem
