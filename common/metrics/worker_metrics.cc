#include "common/metrics/worker_metrics.h"

#include <string>

#include <algorithm>

namespace tandem {
namespace {

constexpr char kStructuredMasksName[] = "tandem_structured_output_masks_total";
constexpr char kStructuredMasksHelp[] =
    "Token masks structured output asked for, by source: computed by walking the vocabulary, or "
    "cached (a parser state already seen with the same schema).";
constexpr char kForwardHelp[] =
    "Engine-thread seconds in the model's forward pass (on a GPU: launching each step and waiting "
    "for its "
    "results), by step: steps that computed prompt tokens (prefill chunks, alone or beside decode "
    "rows) and "
    "decode-only steps.";

}  // namespace

WorkerMetrics::WorkerMetrics(Metrics* m)
    : m_(m),
      batch_tokens_(m->Histogram("tandem_batch_tokens", "Tokens computed per engine step.",
                                 Metrics::CountBuckets())),
      batch_size_(
          m->Histogram("tandem_batch_size", "Sequences per engine step.", Metrics::CountBuckets())),
      step_seconds_(m->Histogram("tandem_step_seconds", "Wall time of one engine step.",
                                 Metrics::TokenLatencyBuckets())),
      waiting_(m->Gauge("tandem_requests_waiting", "Requests waiting to be scheduled.")),
      running_(m->Gauge("tandem_requests_running", "Requests in the running batch.")),
      blocks_used_(m->Gauge("tandem_kv_blocks_used", "KV cache blocks in use.")),
      blocks_free_(m->Gauge("tandem_kv_blocks_free",
                            "KV cache blocks free (including evictable cached ones).")),
      usage_(m->Gauge("tandem_kv_usage_ratio", "Share of the KV cache blocks in use.")),
      usage_peak_(m->Gauge("tandem_kv_usage_peak_ratio",
                           "Highest KV usage ratio since the process started.")),
      pending_transfers_(
          m->Gauge("tandem_kv_transfers_pending", "Reservations waiting for their KV transfer.")),
      kv_links_(m->Gauge("tandem_kv_links",
                         "Side links for KV layers up in this worker (--kv-transport nccl: an NCCL "
                         "communicator and "
                         "its staging memory each, one per prefill-decode connection).")),
      prefix_queries_(m->Counter("tandem_prefix_cache_queries_tokens_total",
                                 "Prompt tokens looked up in the prefix cache.")),
      prefix_hits_(m->Counter("tandem_prefix_cache_hits_tokens_total",
                              "Prompt tokens found in the prefix cache.")),
      preemptions_(m->Counter("tandem_preemptions_total",
                              "Requests preempted (blocks freed, recomputed later).")),
      sampled_device_(m->Counter("tandem_sampled_tokens_total",
                                 "Tokens sampled, by where: on the device that holds "
                                 "the logits, or by the host sampler from copied logits.",
                                 {{"where", "device"}})),
      sampled_host_(m->Counter("tandem_sampled_tokens_total",
                               "Tokens sampled, by where: on the device that holds "
                               "the logits, or by the host sampler from copied logits.",
                               {{"where", "host"}})),
      sampling_row_copies_(
          m->Counter("tandem_sampling_row_copies_total",
                     "Top-p rows sampled on the device whose nucleus outgrew the candidates, so "
                     "that their logits came to the host after all.")),
      structured_masks_computed_(
          m->Counter(kStructuredMasksName, kStructuredMasksHelp, {{"source", "computed"}})),
      structured_masks_cached_(
          m->Counter(kStructuredMasksName, kStructuredMasksHelp, {{"source", "cached"}})),
      structured_mask_seconds_(m->Counter(
          "tandem_structured_output_mask_seconds_total",
          "Engine-thread seconds spent getting structured output's token masks (part of the host "
          "seconds).")),
      prompt_forward_seconds_(
          m->Counter("tandem_engine_forward_seconds_total", kForwardHelp, {{"step", "prompt"}})),
      decode_forward_seconds_(
          m->Counter("tandem_engine_forward_seconds_total", kForwardHelp, {{"step", "decode"}})),
      host_seconds_(m->Counter(
          "tandem_engine_host_seconds_total",
          "Engine-thread seconds in steps outside the forward pass: scheduling, batch assembly, "
          "sampling and stop bookkeeping, queuing the outputs. Over it plus the forward seconds: "
          "the share of a busy engine's time its device waits for the host.")),
      transfer_bytes_(
          m->Counter("tandem_kv_transfer_bytes_total", "KV bytes sent to decode workers.")),
      transfer_failures_(
          m->Counter("tandem_kv_transfer_failures_total", "KV transfers that failed.")),
      transfers_(m->Counter("tandem_kv_transfers_total", "KV transfers finished, failed or not.")),
      transfer_seconds_(m->Histogram("tandem_kv_transfer_seconds",
                                     "Seconds from the first layer sent to the acknowledgement.",
                                     Metrics::LatencyBuckets())),
      spec_proposed_(m->Counter("tandem_spec_decode_draft_tokens_total",
                                "Tokens proposed by speculative decoding.")),
      spec_accepted_(
          m->Counter("tandem_spec_decode_accepted_tokens_total",
                     "Proposed tokens the model kept (its own next token not counted).")),
      spec_verify_steps_(m->Counter(
          "tandem_spec_decode_verify_steps_total",
          "Sequence-steps that verified proposed tokens; (accepted + these) / these is the mean "
          "tokens a speculating step emits.")),
      spec_k_in_force_(m->Gauge("tandem_spec_decode_num_speculative_tokens",
                                "Mean proposal budget (adaptive k) of the last step that had "
                                "speculating sequences.")) {
  // Every outcome's series exists from the start (at zero), so rates and alerts resolve on any
  // worker.
  static constexpr const char* kOutcomes[kNumKvReservationOutcomes] = {"landed", "failed",
                                                                       "timed_out", "cancelled"};
  for (int i = 0; i < kNumKvReservationOutcomes; ++i) {
    reservations_[i] = &m->Counter(
        "tandem_kv_reservations_total",
        "KV reservations of a decode worker that ended, by outcome: the transfer landed, "
        "failed, timed out, or the request was cancelled while it waited.",
        {{"outcome", kOutcomes[i]}});
  }
  for (int i = 0; i < EngineSnapshot::kSpecPositions; ++i) {
    const std::string position = std::to_string(i + 1);
    spec_proposed_at_[i] = &m->Counter(
        "tandem_spec_decode_draft_tokens_at_position_total",
        "Tokens proposed at each position of a step's proposal (1 = right after the sequence).",
        {{"position", position}});
    spec_accepted_at_[i] = &m->Counter(
        "tandem_spec_decode_accepted_tokens_at_position_total",
        "Proposed tokens kept, by position; over the proposed ones, the acceptance rate there.",
        {{"position", position}});
  }
  for (int i = 0; i < EngineSnapshot::kSpecDecisions; ++i) {
    spec_decisions_[i] = &m->Counter(
        "tandem_spec_decode_decisions_total",
        "The adaptive policy's choice for a decoding sequence's step: full k, shrunk or off for "
        "the step's rows (batch) or the sequence's acceptance.",
        {{"decision", kSpecDecisionNames[i]}});
  }
}

void WorkerMetrics::ObserveStep(int64_t tokens, int64_t sequences, double seconds) {
  batch_tokens_.Observe(static_cast<double>(tokens));
  batch_size_.Observe(static_cast<double>(sequences));
  step_seconds_.Observe(seconds);
}

void WorkerMetrics::Refresh(const EngineSnapshot& s) {
  absl::MutexLock lock(&mu_);
  waiting_.Set(static_cast<double>(s.waiting));
  running_.Set(static_cast<double>(s.running));
  blocks_used_.Set(static_cast<double>(s.total_blocks - s.free_blocks));
  blocks_free_.Set(static_cast<double>(s.free_blocks));
  const double usage =
      s.total_blocks > 0 ? 1.0 - static_cast<double>(s.free_blocks) / s.total_blocks : 0.0;
  usage_.Set(usage);
  usage_peak_.Set(s.total_blocks > 0 ? static_cast<double>(s.peak_used_blocks) / s.total_blocks
                                     : 0.0);
  pending_transfers_.Set(static_cast<double>(s.pending_transfers));
  kv_links_.Set(static_cast<double>(s.kv_links));
  prefix_queries_.Increment(
      static_cast<double>(std::max<int64_t>(0, s.prefix_queries - last_.prefix_queries)));
  prefix_hits_.Increment(
      static_cast<double>(std::max<int64_t>(0, s.prefix_hits - last_.prefix_hits)));
  preemptions_.Increment(
      static_cast<double>(std::max<int64_t>(0, s.preemptions - last_.preemptions)));
  sampled_device_.Increment(
      static_cast<double>(std::max<int64_t>(0, s.sampled_on_device - last_.sampled_on_device)));
  sampled_host_.Increment(
      static_cast<double>(std::max<int64_t>(0, s.sampled_on_host - last_.sampled_on_host)));
  sampling_row_copies_.Increment(
      static_cast<double>(std::max<int64_t>(0, s.sampling_row_copies - last_.sampling_row_copies)));
  structured_masks_computed_.Increment(static_cast<double>(
      std::max<int64_t>(0, s.structured_masks_computed - last_.structured_masks_computed)));
  structured_masks_cached_.Increment(static_cast<double>(
      std::max<int64_t>(0, s.structured_masks_cached - last_.structured_masks_cached)));
  structured_mask_seconds_.Increment(
      std::max(0.0, s.structured_mask_seconds - last_.structured_mask_seconds));
  const double prompt = std::max(0.0, s.prompt_forward_seconds - last_.prompt_forward_seconds);
  prompt_forward_seconds_.Increment(prompt);
  decode_forward_seconds_.Increment(
      std::max(0.0, s.forward_seconds - last_.forward_seconds - prompt));
  host_seconds_.Increment(std::max(0.0, s.host_seconds - last_.host_seconds));
  auto grow = [](prometheus::Counter& c, int64_t now, int64_t before) {
    c.Increment(static_cast<double>(std::max<int64_t>(0, now - before)));
  };
  grow(spec_proposed_, s.spec_proposed, last_.spec_proposed);
  grow(spec_accepted_, s.spec_accepted, last_.spec_accepted);
  grow(spec_verify_steps_, s.spec_verify_steps, last_.spec_verify_steps);
  for (int i = 0; i < EngineSnapshot::kSpecPositions; ++i) {
    grow(*spec_proposed_at_[i], s.spec_proposed_at[i], last_.spec_proposed_at[i]);
    grow(*spec_accepted_at_[i], s.spec_accepted_at[i], last_.spec_accepted_at[i]);
  }
  for (int i = 0; i < EngineSnapshot::kSpecDecisions; ++i)
    grow(*spec_decisions_[i], s.spec_decisions[i], last_.spec_decisions[i]);
  spec_k_in_force_.Set(s.spec_k_in_force);
  last_ = s;
}

void WorkerMetrics::ObserveTransfer(int64_t bytes, double seconds, bool ok) {
  transfers_.Increment();
  if (!ok) {
    transfer_failures_.Increment();
    return;
  }
  transfer_bytes_.Increment(static_cast<double>(bytes));
  transfer_seconds_.Observe(seconds);
}

void WorkerMetrics::ObserveReservation(KvReservationOutcome outcome) {
  reservations_[static_cast<int>(outcome)]->Increment();
}

}  // namespace tandem
