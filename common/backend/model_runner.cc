#include "common/backend/model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/backend/composed_ops.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// Scratch buffer slots used by Forward.
enum Slot : size_t {
  kMeta,
  kX,
  kH,
  kQ,
  kK,
  kV,
  kAttn,
  kGate,
  kUp,
  kRows,
  kLogitIn,
  kLogits,
  kArgmax,
  kQkv,
  kGateUp,
  kLogprobs,
  kEdits,
  kSampling,
  kNumSlots
};

// Batch sizes decode graphs are captured for; a step runs in the smallest that holds it. 0: none.
int64_t GraphBucket(int64_t seqs) {
  if (seqs <= 0 || seqs > ModelRunner::kMaxGraphBatch) return 0;
  if (seqs <= 8) {
    int64_t b = 1;
    while (b < seqs) b *= 2;
    return b;
  }
  if (seqs <= 64) return (seqs + 7) / 8 * 8;
  return (seqs + 31) / 32 * 32;
}

}  // namespace

std::unique_ptr<ModelRunner> Backend::CreateModelRunner(TransformerWeights weights) {
  return std::make_unique<ModelRunner>(this, std::move(weights));
}

ModelRunner::ModelRunner(Backend* backend, TransformerWeights weights)
    : backend_(backend), sampler_(backend->sampler()), weights_(std::move(weights)) {
  scratch_.resize(kNumSlots);
}

ModelRunner::~ModelRunner() = default;

absl::Status ModelRunner::Validate(const ForwardInput& in, const KvCacheStorage& kv) const {
  const KvCacheGeometry& g = kv.geometry();
  if (g.num_layers != shape().num_layers || g.num_kv_heads != shape().num_kv_heads ||
      g.head_dim != shape().head_dim) {
    return absl::InvalidArgumentError("KV cache geometry does not match the model");
  }
  if (in.token_ids.empty()) return absl::InvalidArgumentError("forward step with no tokens");
  for (size_t i = 0; i < in.token_ids.size(); ++i) {
    if (in.token_ids[i] < 0 || in.token_ids[i] >= shape().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", in.token_ids[i], " at index ", i,
                                                     " is outside the vocabulary [0, ",
                                                     shape().vocab_size, ")"));
    }
  }
  int64_t total = 0;
  for (size_t s = 0; s < in.seqs.size(); ++s) {
    const SequenceStep& seq = in.seqs[s];
    if (seq.num_new_tokens <= 0 || seq.num_cached_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": bad token counts"));
    }
    const int64_t context = seq.num_cached_tokens + seq.num_new_tokens;
    if (context > shape().max_positions) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", context,
                                                     " tokens exceed max_position_embeddings (",
                                                     shape().max_positions, ")"));
    }
    if (static_cast<int64_t>(seq.block_table.size()) * g.block_size < context) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": block table of ",
                                                     seq.block_table.size(), " blocks cannot hold ",
                                                     context, " tokens"));
    }
    for (int32_t b : seq.block_table) {
      if (b < 0 || b >= g.num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": block id ", b, " outside the pool of ", g.num_blocks));
      }
    }
    total += seq.num_new_tokens;
  }
  if (total != static_cast<int64_t>(in.token_ids.size())) {
    return absl::InvalidArgumentError("sequence token counts do not add up to the batch size");
  }
  for (int32_t r : in.logits_rows) {
    if (r < 0 || r >= total) return absl::InvalidArgumentError("logits row outside the batch");
  }
  if (!in.argmax_only.empty() && in.argmax_only.size() != in.logits_rows.size()) {
    return absl::InvalidArgumentError("argmax_only needs one flag per logits row");
  }
  if (!in.sample_top_k.empty()) {
    if (in.sample_top_k.size() != in.logits_rows.size()) {
      return absl::InvalidArgumentError("sample_top_k needs one entry per logits row");
    }
    for (int32_t k : in.sample_top_k) {
      if (k < 0 || k > kMaxSampleTopK || k > shape().vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample_top_k must be in [0, ", kMaxSampleTopK, "]"));
      }
    }
  }
  if (!in.sample_draws.empty()) {
    if (in.sample_draws.size() != in.logits_rows.size()) {
      return absl::InvalidArgumentError("sample_draws needs one entry per logits row");
    }
    for (const RowDraw& d : in.sample_draws) {
      if (d.mode != RowDraw::kNone && d.mode != RowDraw::kTotal && d.mode != RowDraw::kDraw) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample draw mode ", d.mode, " is not 0, 1 or 2"));
      }
      if (d.mode != RowDraw::kNone &&
          (!(d.inv_temperature > 0.f) || !std::isfinite(d.inv_temperature) ||
           !(d.u >= 0 && d.u < 1) || !(d.min_p >= 0.f && d.min_p <= 1.f))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sample draw needs 1/temperature > 0 and finite, u in [0, 1) and min_p in [0, 1]; got ",
            d.inv_temperature, ", ", d.u, ", ", d.min_p));
      }
    }
  }
  if (!in.logit_edits.empty()) {
    absl::flat_hash_set<int64_t> seen;
    seen.reserve(in.logit_edits.size());
    for (const LogitEdit& e : in.logit_edits) {
      if (e.row < 0 || e.row >= static_cast<int64_t>(in.logits_rows.size()) || e.token < 0 ||
          e.token >= shape().vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("logit edit of row ", e.row, ", token ",
                                                       e.token, " outside the step's logits"));
      }
      if (!seen.insert(static_cast<int64_t>(e.row) * shape().vocab_size + e.token).second) {
        return absl::InvalidArgumentError(absl::StrCat("two logit edits of row ", e.row, ", token ",
                                                       e.token, " (one per token: merge them)"));
      }
    }
  }
  if (!in.logprob_tokens.empty()) {
    if (in.logprob_tokens.size() != in.logits_rows.size()) {
      return absl::InvalidArgumentError("logprob_tokens needs one token per logits row");
    }
    RETURN_IF_ERROR(ValidateLogprobTokens(in.logprob_tokens, in.logprob_top_k));
  }
  return absl::OkStatus();
}

float* ModelRunner::Scratch(size_t index, size_t elements) {
  auto& buf = scratch_[index];
  const size_t bytes = std::max<size_t>(elements, 1) * sizeof(float);
  if (!buf || buf->size() < bytes) {
    // Graphs point at the buffer about to be replaced (the sampling slots are used outside them).
    if (index != kLogprobs && index != kEdits && index != kSampling)
      DropAllGraphs();  // graphs point at the buffer about to be replaced
    auto fresh = backend_->Allocate(bytes + bytes / 4);
    if (!fresh.ok()) return nullptr;
    buf = std::move(fresh).value();
  }
  return buf->f32();
}

int64_t ModelRunner::DecodeGraphBatch(const ForwardInput& in) const {
  if (!(use_graphs_ && backend_->SupportsGraphs()) && !graph_layout_for_testing_) return 0;
  if (!in.allow_graph || in.on_layer_done) return 0;
  const int64_t seqs = static_cast<int64_t>(in.seqs.size());
  if (static_cast<int64_t>(in.token_ids.size()) != seqs ||
      static_cast<int64_t>(in.logits_rows.size()) != seqs)
    return 0;
  for (int64_t i = 0; i < seqs; ++i) {
    if (in.logits_rows[i] != i) return 0;  // one token per sequence, each one's row sampled
    // A captured attention launch covers contexts up to the limit it was captured for.
    if (in.seqs[i].num_cached_tokens + 1 > GraphContextLimit()) return 0;
  }
  return GraphBucket(seqs);
}

absl::Status ModelRunner::Forward(const ForwardInput& input, KvCacheStorage* kv,
                                  std::vector<float>* logits, std::vector<int32_t>* argmax,
                                  std::vector<std::optional<RowLogprobs>>* logprobs,
                                  DeviceSamples* samples) {
  last_logits_ = nullptr;
  RETURN_IF_ERROR(Validate(input, *kv));
  const TransformerShape& c = shape();
  const KvCacheGeometry& g = kv->geometry();
  const int64_t real_rows = static_cast<int64_t>(input.logits_rows.size());
  const int64_t real_seqs = static_cast<int64_t>(input.seqs.size());
  // A decode step padded to its graph batch: extra one-token sequences (token 0) over block 0 whose
  // keys and values are not written (slot -1) and whose rows (one each, after the real ones) are
  // dropped.
  const int64_t graph_batch = DecodeGraphBatch(input);
  static const SequenceStep kPadding{1, 0, {0}};
  const int64_t padding = std::max<int64_t>(0, graph_batch - real_seqs);
  const int64_t num_seqs = real_seqs + padding;
  const int64_t n = static_cast<int64_t>(input.token_ids.size()) + padding;
  const int64_t m = real_rows + padding;

  // Host-side metadata, packed into one int32 upload. Every offset depends on n, S and m alone (the
  // block table, of varying length, comes last), so a captured graph's pointers stay right:
  // ids[n] seq_indptr[S+1] positions[n] context_lens[S] block_indptr[S+1] slot_mapping[n]
  // logits_rows[m] block_indices[B]
  std::vector<int32_t> meta(input.token_ids.begin(), input.token_ids.end());
  meta.resize(static_cast<size_t>(n), 0);
  std::vector<int32_t> seq_indptr{0}, positions, context_lens, block_indptr{0}, blocks, slots;
  int64_t max_context = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const bool is_padding = i >= real_seqs;
    const SequenceStep& s = is_padding ? kPadding : input.seqs[i];
    seq_indptr.push_back(seq_indptr.back() + static_cast<int32_t>(s.num_new_tokens));
    const int64_t context = s.num_cached_tokens + s.num_new_tokens;
    context_lens.push_back(static_cast<int32_t>(context));
    max_context = std::max(max_context, context);
    for (int64_t t = 0; t < s.num_new_tokens; ++t) {
      const int64_t pos = s.num_cached_tokens + t;
      positions.push_back(static_cast<int32_t>(pos));
      slots.push_back(is_padding
                          ? -1
                          : static_cast<int32_t>(s.block_table[pos / g.block_size] * g.block_size +
                                                 pos % g.block_size));
    }
    blocks.insert(blocks.end(), s.block_table.begin(), s.block_table.end());
    block_indptr.push_back(static_cast<int32_t>(blocks.size()));
  }
  const size_t off_seq_indptr = meta.size();
  meta.insert(meta.end(), seq_indptr.begin(), seq_indptr.end());
  const size_t off_positions = meta.size();
  meta.insert(meta.end(), positions.begin(), positions.end());
  const size_t off_context = meta.size();
  meta.insert(meta.end(), context_lens.begin(), context_lens.end());
  const size_t off_block_indptr = meta.size();
  meta.insert(meta.end(), block_indptr.begin(), block_indptr.end());
  const size_t off_slots = meta.size();
  meta.insert(meta.end(), slots.begin(), slots.end());
  const size_t off_rows = meta.size();
  meta.insert(meta.end(), input.logits_rows.begin(), input.logits_rows.end());
  for (int64_t i = real_seqs; i < num_seqs; ++i)
    meta.push_back(static_cast<int32_t>(i));  // padding rows
  const size_t off_blocks = meta.size();
  meta.insert(meta.end(), blocks.begin(), blocks.end());

  const int64_t hidden = c.hidden_size, qs = c.q_size(), kvs = c.kv_size();
  const int64_t inter = c.intermediate_size;
  // A graph batch's metadata buffer holds every block its sequences could have: its size, and so
  // the buffer, does not change from step to step.
  const size_t meta_capacity =
      graph_batch > 0 ? off_blocks + static_cast<size_t>(graph_batch) *
                                         ((c.max_positions + g.block_size - 1) / g.block_size + 1)
                      : meta.size();
  StepBuffers buf;
  auto* meta_dev = reinterpret_cast<int32_t*>(Scratch(kMeta, std::max(meta.size(), meta_capacity)));
  buf.x = Scratch(kX, n * hidden);
  buf.h = Scratch(kH, n * hidden);
  buf.q = Scratch(kQ, n * qs);
  buf.k = Scratch(kK, n * kvs);
  buf.v = Scratch(kV, n * kvs);
  buf.attn = Scratch(kAttn, n * qs);
  buf.gate = Scratch(kGate, n * inter);
  buf.up = Scratch(kUp, weights_.stacked ? 1 : n * inter);  // fused: gate|up lands in kGateUp
  buf.rows = Scratch(kRows, std::max<int64_t>(m, 1) * hidden);
  buf.logit_in = Scratch(kLogitIn, std::max<int64_t>(m, 1) * hidden);
  buf.logits = Scratch(kLogits, std::max<int64_t>(m, 1) * c.vocab_size);
  buf.argmax = reinterpret_cast<int32_t*>(Scratch(kArgmax, std::max<int64_t>(m, 1)));
  buf.qkv = Scratch(kQkv, weights_.stacked ? n * (qs + 2 * kvs) : 1);
  buf.gate_up = Scratch(kGateUp, weights_.stacked ? n * 2 * inter : 1);
  if (!meta_dev || !buf.x || !buf.h || !buf.q || !buf.k || !buf.v || !buf.attn || !buf.gate ||
      !buf.up || !buf.rows || !buf.logit_in || !buf.logits || !buf.argmax || !buf.qkv ||
      !buf.gate_up) {
    return absl::ResourceExhaustedError("cannot allocate activation memory for the forward pass");
  }
  backend_->CopyToDevice(meta_dev, meta.data(), meta.size() * sizeof(int32_t));
  buf.ids = meta_dev;
  buf.out_rows = meta_dev + off_rows;
  buf.md.num_seqs = num_seqs;
  buf.md.num_tokens = n;
  buf.num_rows = m;
  // A graph's attention launch is split for every context its graph may meet: the step's longest
  // rounded up to a power of two (at least 512 keys), within the limit; graphs are kept per
  // (batch, that bound), so short contexts do not pay for the longest splits.
  int64_t graph_context = 0;
  if (graph_batch > 0) {
    graph_context = 512;
    while (graph_context < max_context) graph_context *= 2;
    graph_context = std::min(graph_context, GraphContextLimit());
  }
  buf.md.max_context_len = graph_batch > 0 ? graph_context : max_context;
  buf.md.seq_indptr = meta_dev + off_seq_indptr;
  buf.md.positions = meta_dev + off_positions;
  buf.md.context_lens = meta_dev + off_context;
  buf.md.block_indptr = meta_dev + off_block_indptr;
  buf.md.block_indices = meta_dev + off_blocks;
  buf.md.slot_mapping = meta_dev + off_slots;

  // Rows flagged argmax-only come back as one id each; the logits are copied only when some row
  // needs them (then all the real rows: one copy).
  // (Only when some row is argmax-only: a step of sampled rows reads back nothing more.)
  const bool want_argmax =
      argmax != nullptr && std::any_of(input.argmax_only.begin(), input.argmax_only.end(),
                                       [](uint8_t f) { return f != 0; });
  const bool want_logprobs =
      logprobs != nullptr && !input.logprob_tokens.empty() && logprobs_on_device();
  const bool want_sampling = samples != nullptr && samples_on_device();
  bool want_logits = false;  // some row needs its logits on the host
  for (int64_t k = 0; k < real_rows; ++k) {
    const bool argmax_only = want_argmax && input.argmax_only[k] != 0;
    const bool logprobs_only =
        want_logprobs && input.logprob_tokens[k] != ForwardInput::kNoLogprobs;
    const bool top_k_only =
        want_sampling && !input.sample_top_k.empty() && input.sample_top_k[k] > 0;
    const bool drawn = want_sampling && !input.sample_draws.empty() &&
                       input.sample_draws[k].mode == RowDraw::kDraw;
    want_logits |= !argmax_only && !logprobs_only && !top_k_only && !drawn;
  }
  // The logprob tokens go up now, while the stream is idle (a copy waits for it).
  int32_t* logprob_region = nullptr;
  if (want_logprobs && real_rows > 0) {
    ASSIGN_OR_RETURN(logprob_region, UploadLogprobTokens(input));
  }
  SamplingUpload sampling;
  if (want_sampling && real_rows > 0) {
    ASSIGN_OR_RETURN(sampling, UploadSampling(input));
  }
  if (graph_batch > 0 && use_graphs_ && backend_->SupportsGraphs()) {
    RETURN_IF_ERROR(RunDecodeGraph({graph_batch, graph_context}, buf, kv));
  } else {
    Enqueue(buf, kv, input.on_layer_done, /*argmax=*/want_argmax || graph_batch > 0);
  }
  last_logits_ = buf.logits;
  last_rows_ = real_rows;
  // The host copy and the logprobs see the raw logits; the sampling edits them, then the argmax is
  // read. Everything the step computes on the device is enqueued before the first of its results is
  // read (each read waits for the device), except after the host copy of whole rows, which already
  // waits.
  logits->assign(want_logits ? static_cast<size_t>(real_rows * c.vocab_size) : 0, 0.f);
  if (want_logits && real_rows > 0)
    backend_->CopyToHost(logits->data(), buf.logits, logits->size() * sizeof(float));
  if (want_logprobs && real_rows > 0) EnqueueLogprobs(input, buf.logits, logprob_region);
  if (want_sampling && real_rows > 0)
    EnqueueSampling(input, sampling, buf.logits, want_argmax ? buf.argmax : nullptr);
  if (logprobs != nullptr)
    logprobs->assign(want_logprobs ? static_cast<size_t>(real_rows) : 0, std::nullopt);
  if (want_logprobs && real_rows > 0) ReadLogprobs(input, logprob_region, logprobs);
  if (samples != nullptr) *samples = DeviceSamples{};
  if (want_sampling && real_rows > 0) ReadSampling(input, sampling, samples);
  if (argmax != nullptr) argmax->assign(want_argmax ? static_cast<size_t>(real_rows) : 0, -1);
  if (want_argmax && real_rows > 0) {
    backend_->CopyToHost(argmax->data(), buf.argmax,
                         static_cast<size_t>(real_rows) * sizeof(int32_t));
  }
  return backend_->CheckErrors();
}

namespace {

// The sampling region's layout, in 4-byte words, for `rows` logits rows and candidates `width`
// wide: draws [rows] (RowDraw, 6 words) | row_k [rows], uploaded together, then ids [rows][width] |
// values [rows][width] | tokens [rows] | totals [rows] (double, 8-byte aligned), copied back
// together.
struct SamplingLayout {
  SamplingLayout(int64_t rows, int64_t width)
      : row_k(6 * rows),
        ids(7 * rows),
        values(ids + rows * width),
        tokens(values + rows * width),
        totals((tokens + rows + 1) / 2 * 2),
        end(totals + 2 * rows) {}
  int64_t row_k, ids, values, tokens, totals, end;
};

}  // namespace

absl::StatusOr<ModelRunner::SamplingUpload> ModelRunner::UploadSampling(const ForwardInput& in) {
  SamplingUpload up;
  const int64_t rows = static_cast<int64_t>(in.logits_rows.size());
  if (!in.logit_edits.empty()) {
    const size_t bytes = in.logit_edits.size() * sizeof(LogitEdit);
    auto* edits = reinterpret_cast<LogitEdit*>(Scratch(kEdits, bytes / sizeof(float)));
    if (edits == nullptr)
      return absl::ResourceExhaustedError("cannot allocate the logit edits buffer");
    backend_->CopyToDevice(edits, in.logit_edits.data(), bytes);
    up.edits = edits;
  }
  for (int32_t k : in.sample_top_k) up.width = std::max(up.width, k);
  for (const RowDraw& d : in.sample_draws) up.draws |= d.mode != RowDraw::kNone;
  if (up.width == 0 && !up.draws) return up;
  const SamplingLayout at(rows, up.width);
  up.region = reinterpret_cast<int32_t*>(Scratch(kSampling, static_cast<size_t>(at.end)));
  if (up.region == nullptr)
    return absl::ResourceExhaustedError("cannot allocate the sampling buffer");
  std::vector<int32_t> host(static_cast<size_t>(at.ids), 0);
  if (up.draws)
    std::memcpy(host.data(), in.sample_draws.data(), in.sample_draws.size() * sizeof(RowDraw));
  if (up.width > 0)
    std::copy(in.sample_top_k.begin(), in.sample_top_k.end(), host.begin() + at.row_k);
  backend_->CopyToDevice(up.region, host.data(), host.size() * sizeof(int32_t));
  return up;
}

void ModelRunner::EnqueueSampling(const ForwardInput& in, const SamplingUpload& up,
                                  float* logits_dev, int32_t* argmax_dev) {
  const int64_t rows = static_cast<int64_t>(in.logits_rows.size());
  const int64_t vocab = shape().vocab_size;
  if (up.edits != nullptr) {
    sampler_->ApplyLogitEdits(logits_dev, vocab, up.edits,
                              static_cast<int64_t>(in.logit_edits.size()));
    // Greedy rows with processors take the edited row's argmax (the others' rows are unchanged):
    // taken again only when such a row is in the step.
    const bool edited_argmax =
        argmax_dev != nullptr && !in.argmax_only.empty() &&
        std::any_of(in.logit_edits.begin(), in.logit_edits.end(),
                    [&](const LogitEdit& e) { return in.argmax_only[e.row] != 0; });
    if (edited_argmax) backend_->ArgmaxRows(logits_dev, rows, vocab, argmax_dev);
  }
  if (up.region == nullptr) return;
  const SamplingLayout at(rows, up.width);
  int32_t* region = up.region;
  if (up.width > 0) {
    sampler_->TopKRows(logits_dev, rows, vocab, up.width, region + at.row_k, region + at.ids,
                       reinterpret_cast<float*>(region + at.values));
  }
  if (up.draws) {
    sampler_->SampleRows(logits_dev, rows, vocab, reinterpret_cast<const RowDraw*>(region),
                         region + at.tokens, reinterpret_cast<double*>(region + at.totals));
  }
}

void ModelRunner::ReadSampling(const ForwardInput& in, const SamplingUpload& up,
                               DeviceSamples* out) {
  if (up.region == nullptr) return;
  const int64_t rows = static_cast<int64_t>(in.logits_rows.size());
  const SamplingLayout at(rows, up.width);
  const int32_t* region = up.region;
  std::vector<int32_t> host(static_cast<size_t>(at.end - at.ids));
  backend_->CopyToHost(host.data(), region + at.ids, host.size() * sizeof(int32_t));
  auto word = [&](int64_t offset) { return host.begin() + (offset - at.ids); };
  out->k = up.width;
  if (up.width > 0) {
    out->ids.assign(word(at.ids), word(at.values));
    out->logits.resize(static_cast<size_t>(rows * up.width));
    std::memcpy(out->logits.data(), &*word(at.values), out->logits.size() * sizeof(float));
  }
  if (up.draws) {
    out->tokens.assign(word(at.tokens), word(at.tokens) + rows);
    out->totals.resize(static_cast<size_t>(rows));
    std::memcpy(out->totals.data(), &*word(at.totals), out->totals.size() * sizeof(double));
  }
}

absl::Status ModelRunner::ValidateLogprobTokens(const std::vector<int32_t>& tokens,
                                                int32_t top_k) const {
  if (top_k < 0 || top_k > kMaxLogprobsTopK || top_k > shape().vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprob_top_k must be in [0, ", kMaxLogprobsTopK, "]"));
  }
  for (int32_t t : tokens) {
    if (t < ForwardInput::kNoLogprobs || t >= shape().vocab_size) {
      return absl::InvalidArgumentError("logprob token outside the vocabulary");
    }
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::LastStepLogprobs(const std::vector<int32_t>& tokens, int32_t top_k,
                                           std::vector<std::optional<RowLogprobs>>* out) {
  if (!logprobs_on_device())
    return absl::FailedPreconditionError("this backend does not compute logprobs");
  if (last_logits_ == nullptr || static_cast<int64_t>(tokens.size()) != last_rows_) {
    return absl::FailedPreconditionError(
        absl::StrCat(tokens.size(), " tokens for the last step's ", last_rows_, " logits rows"));
  }
  RETURN_IF_ERROR(ValidateLogprobTokens(tokens, top_k));
  ForwardInput in;
  in.logprob_tokens = tokens;
  in.logprob_top_k = top_k;
  ASSIGN_OR_RETURN(int32_t * region, UploadLogprobTokens(in));
  out->assign(tokens.size(), std::nullopt);
  EnqueueLogprobs(in, last_logits_, region);
  ReadLogprobs(in, region, out);
  return backend_->CheckErrors();
}

absl::Status ModelRunner::CopyLogitsRow(int64_t row, std::vector<float>* out) {
  if (last_logits_ == nullptr || row < 0 || row >= last_rows_) {
    return absl::FailedPreconditionError(
        absl::StrCat("logits row ", row, " is not one of the last step's ", last_rows_, " rows"));
  }
  out->resize(static_cast<size_t>(shape().vocab_size));
  backend_->CopyToHost(out->data(), last_logits_ + row * shape().vocab_size,
                       out->size() * sizeof(float));
  return backend_->CheckErrors();
}

absl::StatusOr<int32_t*> ModelRunner::UploadLogprobTokens(const ForwardInput& in) {
  const int64_t rows = static_cast<int64_t>(in.logprob_tokens.size());
  // One scratch region, copied back at once: tokens (in) | token | logprob | rank | top ids | top
  // logprobs.
  auto* region =
      reinterpret_cast<int32_t*>(Scratch(kLogprobs, 4 * rows + 2 * rows * in.logprob_top_k));
  if (region == nullptr) return absl::ResourceExhaustedError("cannot allocate the logprobs buffer");
  backend_->CopyToDevice(region, in.logprob_tokens.data(),
                         in.logprob_tokens.size() * sizeof(int32_t));
  return region;
}

void ModelRunner::EnqueueLogprobs(const ForwardInput& in, const float* logits_dev,
                                  int32_t* region) {
  const int64_t rows = static_cast<int64_t>(in.logprob_tokens.size());
  const int64_t k = in.logprob_top_k;
  int32_t* token_out = region + rows;
  auto* logprob = reinterpret_cast<float*>(region + 2 * rows);
  int32_t* rank = region + 3 * rows;
  int32_t* top_ids = region + 4 * rows;
  auto* top_logprobs = reinterpret_cast<float*>(region + 4 * rows + rows * k);
  sampler_->Logprobs(logits_dev, rows, shape().vocab_size, region, static_cast<int32_t>(k),
                     token_out, logprob, rank, top_ids, top_logprobs);
}

void ModelRunner::ReadLogprobs(const ForwardInput& in, const int32_t* region,
                               std::vector<std::optional<RowLogprobs>>* out) {
  const int64_t rows = static_cast<int64_t>(in.logprob_tokens.size());
  const int64_t k = in.logprob_top_k;
  std::vector<int32_t> host(static_cast<size_t>(4 * rows + 2 * rows * k));
  backend_->CopyToHost(host.data(), region, host.size() * sizeof(int32_t));
  for (int64_t i = 0; i < rows; ++i) {
    if (in.logprob_tokens[i] == ForwardInput::kNoLogprobs) continue;
    RowLogprobs r;
    r.token = host[rows + i];
    std::memcpy(&r.logprob, &host[2 * rows + i], sizeof(float));
    r.rank = host[3 * rows + i];
    r.top_ids.assign(host.begin() + 4 * rows + i * k, host.begin() + 4 * rows + (i + 1) * k);
    r.top_logprobs.resize(static_cast<size_t>(k));
    if (k > 0) {  // memcpy into an empty vector's null data() is undefined even for 0 bytes
      std::memcpy(r.top_logprobs.data(), &host[4 * rows + rows * k + i * k],
                  static_cast<size_t>(k) * sizeof(float));
    }
    (*out)[i] = std::move(r);
  }
}

absl::Status ModelRunner::RunDecodeGraph(std::pair<int64_t, int64_t> key, const StepBuffers& buf,
                                         KvCacheStorage* kv) {
  // Graphs write into the cache memory they were captured with.
  const GraphCache cache{kv->k_data(), kv->v_data(), kv->geometry().num_blocks,
                         kv->geometry().block_size, kv->geometry().dtype};
  if (!(cache == graph_cache_)) {
    DropAllGraphs();
    graph_cache_ = cache;
  }
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    absl::Status s = backend_->Replay(it->second);
    if (s.ok()) ++graph_replays_;
    if (s.ok() || s.code() != absl::StatusCode::kNotFound) return s;
    graphs_.clear();  // the backend dropped them (its scratch grew): capture again
  }
  // First step of this batch size: run it as it is (which also grows every buffer it needs), then
  // record the same work for the next ones. A capture that fails leaves graphs off, not the step.
  Enqueue(buf, kv, nullptr, /*argmax=*/true);
  RETURN_IF_ERROR(backend_->CheckErrors());
  if (absl::Status s = backend_->BeginCapture(); !s.ok()) {
    use_graphs_ = false;
    graph_error_ = std::string(s.message());
    return absl::OkStatus();
  }
  Enqueue(buf, kv, nullptr, /*argmax=*/true);
  absl::StatusOr<int64_t> graph = backend_->EndCapture();
  if (!graph.ok()) {
    use_graphs_ = false;
    graph_error_ = std::string(graph.status().message());
    return absl::OkStatus();
  }
  graphs_[key] = *graph;
  return absl::OkStatus();
}

float ModelRunner::attention_scale() const {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape().head_dim)));
}

QkvAttentionInput ModelRunner::StackedQkvInput(const TransformerLayerWeights& lw,
                                               const StepBuffers& buf, const float* x) const {
  const TransformerShape& c = shape();
  QkvAttentionInput in;
  in.x = x;
  in.w = &lw.qkv;
  in.bias = c.attention_bias ? &lw.qkv_bias : nullptr;
  in.qkv = buf.qkv;
  if (c.qk_norm) {
    in.q_norm = &lw.q_norm;
    in.k_norm = &lw.k_norm;
  }
  in.eps = c.rms_norm_eps;
  in.inv_freq = inv_freq();
  in.q = buf.q;
  in.k = buf.k;
  in.v = buf.v;
  return in;
}

void ModelRunner::SeparateQkvAttention(const TransformerLayerWeights& lw, const StepBuffers& buf,
                                       KvCacheStorage* kv, int64_t l) const {
  const TransformerShape& c = shape();
  const int64_t n = buf.md.num_tokens;
  const float eps = c.rms_norm_eps;
  Backend& b = *backend_;
  const bool bias = c.attention_bias;
  const Backend::Projection qkv[] = {{&lw.q, bias ? &lw.q_bias : nullptr, buf.q},
                                     {&lw.k, bias ? &lw.k_bias : nullptr, buf.k},
                                     {&lw.v, bias ? &lw.v_bias : nullptr, buf.v}};
  b.LinearEach(buf.h, n, qkv);
  if (c.qk_norm) {
    b.RmsNorm(buf.q, lw.q_norm, eps, n * c.num_q_heads, c.head_dim, buf.q);
    b.RmsNorm(buf.k, lw.k_norm, eps, n * c.num_kv_heads, c.head_dim, buf.k);
  }
  b.Rope(buf.q, buf.k, buf.md.positions, inv_freq(), n, c.num_q_heads, c.num_kv_heads, c.head_dim);
  b.PagedAttention(buf.q, buf.k, buf.v, kv->k_data(), kv->v_data(), kv->geometry(), l, buf.md,
                   c.num_q_heads, attention_scale(), buf.attn);
}

void ModelRunner::SeparateGateUp(const TransformerLayerWeights& lw, const StepBuffers& buf) const {
  const int64_t n = buf.md.num_tokens;
  const Backend::Projection gate_up[] = {{&lw.gate, nullptr, buf.gate}, {&lw.up, nullptr, buf.up}};
  backend_->LinearEach(buf.h, n, gate_up);
  backend_->SiluMul(buf.gate, buf.up, n, shape().intermediate_size, buf.gate);
}

void ModelRunner::Enqueue(const StepBuffers& buf, KvCacheStorage* kv,
                          const std::function<void(int64_t)>& on_layer_done, bool argmax) {
  const TransformerShape& c = shape();
  const TransformerWeights& w = weights_;
  const int64_t n = buf.md.num_tokens, m = buf.num_rows, hidden = c.hidden_size;
  const float eps = c.rms_norm_eps;
  float *x = buf.x, *h = buf.h, *gate = buf.gate;
  Backend& b = *backend_;
  // h = input_norm(x) at the top of each layer: the first layer's here, the others' with the last
  // residual add of the layer before.
  b.Embedding(w.embed, buf.ids, n, x);
  if (c.num_layers > 0) b.RmsNorm(x, w.layers[0].input_norm, eps, n, hidden, h);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const TransformerLayerWeights& lw = w.layers[l];
    if (w.stacked) {
      // One GEMM for q|k|v, its rows split into heads on the way to attention.
      ComposedQkvAttention(b, StackedQkvInput(lw, buf, h), kv->k_data(), kv->v_data(),
                           kv->geometry(), l, buf.md, c.num_q_heads, attention_scale(), buf.attn);
    } else {
      SeparateQkvAttention(lw, buf, kv, l);
    }
    if (on_layer_done) on_layer_done(l);
    b.Linear(buf.attn, n, lw.o, nullptr, h);
    ComposedAddRmsNorm(b, x, h, lw.post_norm, eps, n, hidden, h);
    if (w.stacked) {
      ComposedLinearSiluMul(b, h, n, lw.gate_up, buf.gate_up, gate);
    } else {
      SeparateGateUp(lw, buf);
    }
    b.Linear(gate, n, lw.down, nullptr, h);
    if (l + 1 < c.num_layers) {
      ComposedAddRmsNorm(b, x, h, w.layers[l + 1].input_norm, eps, n, hidden, h);
    } else {
      b.Add(x, h, n * hidden);
    }
  }
  if (m == 0) return;
  b.GatherRows(x, buf.out_rows, m, hidden, buf.rows);
  b.RmsNorm(buf.rows, w.final_norm, eps, m, hidden, buf.logit_in);
  b.Linear(buf.logit_in, m, w.lm_head, nullptr, buf.logits);
  if (argmax) b.ArgmaxRows(buf.logits, m, c.vocab_size, buf.argmax);
}

}  // namespace tandem
