// The model runner: runs one step of a transformer (transformer.h) over a paged KV cache on its
// backend. It owns what a step needs besides the weights: validation of the step, the packed
// metadata upload, scratch buffers, decode graphs (padding a decode step to a bucketed batch,
// capturing and replaying it), and the device sampling and logprobs I/O. Each backend makes its
// own (Backend::CreateModelRunner): this generic one runs the layer as the Backend's core ops
// compose it (composed_ops.h), which is the CPU's; the CUDA backend's (cuda/cuda_model_runner.h)
// runs its fused kernels instead, with the same results.
//
// A runner takes any number of new tokens per sequence on top of what its blocks already hold, so
// a prompt can be evaluated whole or in chunks with the same result. One thread at a time.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backend.h"
#include "common/backend/composed_ops.h"
#include "common/backend/kv_cache_storage.h"
#include "common/backend/transformer.h"
#include "common/sampling/device_sampling.h"

namespace tandem {

struct SequenceStep {
  int64_t num_new_tokens = 0;     // tokens of this sequence in ForwardInput::token_ids (in order)
  int64_t num_cached_tokens = 0;  // tokens already in the cache; new tokens take positions after it
  std::vector<int32_t> block_table;  // physical blocks covering cached + new tokens
};

struct ForwardInput {
  std::vector<int32_t> token_ids;  // [num_tokens], sequences concatenated in order
  std::vector<SequenceStep> seqs;
  std::vector<int32_t> logits_rows;  // rows of token_ids whose next-token logits are returned
  // Empty, or one flag per logits row: 1 = only its argmax is wanted (a plain greedy step), which
  // Forward returns instead of copying the row when given somewhere to put it.
  std::vector<uint8_t> argmax_only;
  // Empty, or per logits row: the token whose log-probability to compute where the logits are (on
  // backends whose DeviceSampler::SupportsLogprobs; -1: the row's argmax), or kNoLogprobs. A row
  // with one needs no host logits for it.
  static constexpr int32_t kNoLogprobs = -2;
  std::vector<int32_t> logprob_tokens;
  int32_t logprob_top_k = 0;  // top entries returned per such row
  // Sampling where the logits are (backends whose DeviceSampler::SupportsSampling;
  // SequenceSampler's DeviceSamplingPlan). Rows that use it need no host logits. Applied first, to
  // the rows' logits: the steps' logits processors (LogitEdit::row is a position in logits_rows).
  // After the host copy and the logprobs, which see the model's raw logits; before the argmax, the
  // candidates and the draws, which see the edited ones.
  std::vector<LogitEdit> logit_edits;
  // Empty, or per logits row: k > 0 = the row's k most likely tokens and their logits are wanted
  // (DeviceSamples::ids/logits); 0 = not.
  std::vector<int32_t> sample_top_k;
  // Empty, or per logits row: the row's weight total or drawn token (DeviceSamples::totals/tokens).
  std::vector<RowDraw> sample_draws;
  // The step may run as a captured decode graph (see ModelRunner::set_use_graphs): set by the
  // engine for steps outside the prefill role (whose per-layer callbacks and transfers a graph
  // would skip).
  bool allow_graph = false;
  // Called after layer l's KV for this step is written (before layer l+1 runs): a prefill worker
  // sends the layer then, overlapping the transfer with the rest of the forward pass. On an
  // asynchronous backend (CUDA) the write is only enqueued at that point: a consumer must order
  // itself after it on the device (an event), not read the cache from the host at once.
  std::function<void(int64_t layer)> on_layer_done;
};

// What the device computed for the rows' sampling (ForwardInput::sample_top_k, sample_draws).
struct DeviceSamples {
  // Candidates [logits rows][k], k = the largest any row asked for (a row's own k candidates are
  // its first k), most likely first; rows that asked for none hold garbage.
  int32_t k = 0;
  std::vector<int32_t> ids;
  std::vector<float> logits;
  // Per logits row when some row had a draw (else empty): RowDraw::kDraw's token, kTotal's total.
  std::vector<int32_t> tokens;
  std::vector<double> totals;
};

// One row's log-probabilities computed on the backend (ForwardInput::logprob_tokens).
struct RowLogprobs {
  int32_t token = 0;
  float logprob = 0.f;
  int32_t rank = 0;
  std::vector<int32_t> top_ids;  // most likely first, logprob_top_k of them
  std::vector<float> top_logprobs;
};

class ModelRunner {
 public:
  ModelRunner(Backend* backend, TransformerWeights weights);
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;
  virtual ~ModelRunner();

  // Most top entries ForwardInput::logprob_top_k may ask for.
  static constexpr int32_t kMaxLogprobsTopK = 64;
  // Largest decode batch captured as a CUDA graph; bigger steps run op by op.
  static constexpr int64_t kMaxGraphBatch = 256;
  // Largest k of ForwardInput::sample_top_k taken on the device.
  static constexpr int32_t kMaxSampleTopK = 256;

  const TransformerShape& shape() const { return weights_.shape; }
  Backend* backend() const { return backend_; }
  // Whether ForwardInput's sampling fields (sample_top_k, sample_draws, logit_edits) and its
  // logprob_tokens are computed where the logits are (the backend's DeviceSampler).
  bool samples_on_device() const { return sampler_ != nullptr && sampler_->SupportsSampling(); }
  bool logprobs_on_device() const { return sampler_ != nullptr && sampler_->SupportsLogprobs(); }

  // Decode steps (one token per sequence, each row sampled, input.allow_graph) run as CUDA graphs
  // on backends that have them: padded to a bucketed batch (1, 2, 4, 8, then multiples of 8 to 64,
  // of 32 to kMaxGraphBatch) with sequences that write nothing, captured on the first step of each
  // size, replayed after. On a batch-invariant backend the results are bit-identical to running op
  // by op (elsewhere the padded batch may pick other GEMM kernels, as any batch can). On by
  // default.
  void set_use_graphs(bool on) { use_graphs_ = on; }
  bool use_graphs() const { return use_graphs_ && backend_->SupportsGraphs(); }
  // Decode graphs captured and not dropped, and steps that replayed one.
  size_t num_graphs() const { return graphs_.size(); }
  int64_t graph_replays() const { return graph_replays_; }
  // Longest context a decode graph serves (steps beyond it run op by op): the engine's
  // max_model_len; 0 = the model's max_positions. Attention in a graph splits keys for this length.
  void set_graph_context_limit(int64_t tokens) {
    if (tokens == graph_context_limit_) return;
    graph_context_limit_ = tokens;
    DropAllGraphs();  // their attention was split for the old limit
  }
  // Why capturing failed (graphs are then off), empty if it did not.
  const std::string& graph_error() const { return graph_error_; }
  // Runs decode steps through the padded graph layout even without graphs (tests on the CPU).
  void set_graph_layout_for_testing(bool on) { graph_layout_for_testing_ = on; }

  // Runs one step. On success writes logits [logits_rows.size()][vocab_size] to `logits` (host).
  // With `argmax` and some row of input.argmax_only set: argmax[i] = the argmax of logits row i
  // (ArgmaxRows, computed on the device; empty when no row is argmax-only), and `logits` is left
  // empty when every row is argmax-only (nothing but the ids leaves the device). Validates ids,
  // positions and block tables first; INVALID_ARGUMENT leaves the cache untouched. With `logprobs`
  // and input.logprob_tokens where logprobs_on_device(): (*logprobs)[i] for every row that asked.
  // With `samples` where samples_on_device(): input.logit_edits applied, and the candidates,
  // totals and tokens the rows asked for (left empty elsewhere: the caller samples from host rows).
  // `logits` holds every row, unedited, or is empty when no row needs host logits.
  absl::Status Forward(const ForwardInput& input, KvCacheStorage* kv, std::vector<float>* logits,
                       std::vector<int32_t>* argmax = nullptr,
                       std::vector<std::optional<RowLogprobs>>* logprobs = nullptr,
                       DeviceSamples* samples = nullptr);
  // Logits row `row` of the last Forward as the device holds it, edits applied ([vocab_size] into
  // `out`): for a step whose sampling needs the whole row after all (a nucleus wider than its
  // candidates). Valid until the next Forward.
  absl::Status CopyLogitsRow(int64_t row, std::vector<float>* out);
  // Log-probabilities over the last Forward's logits as the device holds them (raw, for rows
  // without logit edits), for tokens chosen after it (tokens[i]: logits row i's token, -1 its
  // argmax, or ForwardInput::kNoLogprobs), with `top_k` top entries: (*out)[i] for every row that
  // asked. Where logprobs_on_device(); valid until the next Forward.
  absl::Status LastStepLogprobs(const std::vector<int32_t>& tokens, int32_t top_k,
                                std::vector<std::optional<RowLogprobs>>* out);

 protected:
  // Device buffers and metadata of one step (pointers into the scratch slots).
  struct StepBuffers {
    const int32_t* ids = nullptr;       // [n] token ids (in the metadata upload)
    const int32_t* out_rows = nullptr;  // [m] logits rows (in the metadata upload)
    AttentionMetadata md;
    float *x = nullptr, *h = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr;
    float *gate = nullptr, *up = nullptr, *rows = nullptr, *logit_in = nullptr, *logits = nullptr;
    float *qkv = nullptr, *gate_up = nullptr;  // [n][q + 2 kv], [n][2 inter] when stacked
    int32_t* argmax = nullptr;                 // [m]
    int64_t num_rows = 0;                      // m: logits rows (md.num_tokens is n)
  };
  // Enqueues the step's work: embedding, every layer (calling `on_layer_done` after each layer's KV
  // write, when set), logits of the buffers' rows and, with `argmax`, their argmax. This one runs
  // the composed ops (composed_ops.h); a backend's runner may run its own fused ones instead, with
  // the same results.
  virtual void Enqueue(const StepBuffers& buf, KvCacheStorage* kv,
                       const std::function<void(int64_t)>& on_layer_done, bool argmax);
  const TransformerWeights& weights() const { return weights_; }
  // The rotary inverse frequencies [head_dim / 2] on the device.
  const float* inv_freq() const { return static_cast<const float*>(weights_.rope_inv_freq.data); }
  // 1 / sqrt(head_dim).
  float attention_scale() const;
  // Layer `lw`'s attention input over stacked weights, its projection taking `x` (q|k|v weights and
  // bias, scratch, q/k norms, the rotary table); a runner that fuses the input norm adds it.
  QkvAttentionInput StackedQkvInput(const TransformerLayerWeights& lw, const StepBuffers& buf,
                                    const float* x) const;
  // Layer l's attention over separate weights, on the core ops: q, k, v projected from buf.h,
  // normalised per head (Qwen3), rotated, attended (writing the cache) into buf.attn.
  void SeparateQkvAttention(const TransformerLayerWeights& lw, const StepBuffers& buf,
                            KvCacheStorage* kv, int64_t l) const;
  // buf.gate = silu(buf.h · gate^T) * (buf.h · up^T) over separate weights (buf.up scratch).
  void SeparateGateUp(const TransformerLayerWeights& lw, const StepBuffers& buf) const;

 private:
  absl::Status Validate(const ForwardInput& input, const KvCacheStorage& kv) const;
  // Per logits row a token to take the log-probability of (or -1, ForwardInput::kNoLogprobs) and at
  // most kMaxLogprobsTopK top entries: Forward's logprob_tokens and LastStepLogprobs' tokens.
  absl::Status ValidateLogprobTokens(const std::vector<int32_t>& tokens, int32_t top_k) const;
  float* Scratch(size_t index, size_t elements);
  // The step's batch if it runs in the decode graph layout, else 0.
  int64_t DecodeGraphBatch(const ForwardInput& input) const;
  int64_t GraphContextLimit() const {
    return graph_context_limit_ > 0 ? std::min(graph_context_limit_, shape().max_positions)
                                    : shape().max_positions;
  }
  // Replays the graph of `key`, or runs the step and captures it for the next time. `key`: (padded
  // batch, the context its attention is split for).
  absl::Status RunDecodeGraph(std::pair<int64_t, int64_t> key, const StepBuffers& buf,
                              KvCacheStorage* kv);
  // Forgets every captured graph (the backend's and the map of them).
  void DropAllGraphs() {
    if (!graphs_.empty()) backend_->DropGraphs();
    graphs_.clear();
  }
  // DeviceSampler::Logprobs over the step's real rows into `out`, in three parts: the tokens go up
  // before the step (into a scratch region that is also where the results land), the computation
  // is enqueued after it, and the results are read once everything else the step computes is
  // enqueued.
  absl::StatusOr<int32_t*> UploadLogprobTokens(const ForwardInput& in);
  void EnqueueLogprobs(const ForwardInput& in, const float* logits_dev, int32_t* region);
  void ReadLogprobs(const ForwardInput& in, const int32_t* region,
                    std::vector<std::optional<RowLogprobs>>* out);
  // Device sampling in the same three parts: the edits, draws and per-row k go up first, while the
  // stream is idle (a copy to the device waits for it); after the step, the edits are applied to
  // its logits (and the argmax taken again, when `argmax_dev`), the candidates and draws computed;
  // then the rows' candidates and draws come back into `out`.
  struct SamplingUpload {
    const LogitEdit* edits = nullptr;  // [logit_edits.size()]
    int32_t* region = nullptr;         // see UploadSampling
    int32_t width = 0;                 // the widest sample_top_k
    bool draws = false;                // some row has a RowDraw
  };
  absl::StatusOr<SamplingUpload> UploadSampling(const ForwardInput& input);
  void EnqueueSampling(const ForwardInput& input, const SamplingUpload& up, float* logits_dev,
                       int32_t* argmax_dev);
  void ReadSampling(const ForwardInput& input, const SamplingUpload& up, DeviceSamples* out);

  Backend* backend_ = nullptr;
  DeviceSampler* sampler_ = nullptr;  // the backend's, or null
  TransformerWeights weights_;
  std::vector<std::unique_ptr<DeviceBuffer>> scratch_;
  bool use_graphs_ = true;
  bool graph_layout_for_testing_ = false;
  std::string graph_error_;
  std::map<std::pair<int64_t, int64_t>, int64_t>
      graphs_;         // (decode batch, context) → backend graph id
  struct GraphCache {  // the cache memory the graphs write into
    const void* k = nullptr;
    const void* v = nullptr;
    int64_t num_blocks = 0, block_size = 0;
    DType dtype = DType::kF32;
    bool operator==(const GraphCache& o) const {
      return k == o.k && v == o.v && num_blocks == o.num_blocks && block_size == o.block_size &&
             dtype == o.dtype;
    }
  };
  GraphCache graph_cache_;
  // The last Forward's logits on the device [last_rows_][vocab] (CopyLogitsRow).
  const float* last_logits_ = nullptr;
  int64_t last_rows_ = 0;
  int64_t graph_replays_ = 0;
  int64_t graph_context_limit_ = 0;
};

}  // namespace tandem
