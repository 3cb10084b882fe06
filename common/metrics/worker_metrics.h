// The metrics of a worker (prefill, decode or combined role) over the process's Metrics object:
// queue and batch gauges, per-step histograms, KV pool usage and its peak, prefix-cache and
// preemption counters, KV transfers (sent, prefill side) and reservations (received, decode side),
// speculative decoding. Gauges and counters that mirror engine
// state are refreshed from the engine loop's published snapshot (never from the engine itself,
// which belongs to its thread); per-step histograms are observed by the engine loop.
#pragma once

#include <array>
#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"

namespace tandem {

// What the engine loop publishes after each iteration.
struct EngineSnapshot {
  int64_t waiting = 0, running = 0, free_blocks = 0, total_blocks = 0;
  int64_t prefix_queries = 0, prefix_hits = 0, preemptions = 0;                 // cumulative
  int64_t sampled_on_device = 0, sampled_on_host = 0, sampling_row_copies = 0;  // cumulative
  int64_t pending_transfers = 0;
  int64_t kv_links = 0;          // side links (NCCL communicators) for KV layers up in this process
  int64_t peak_used_blocks = 0;  // highest blocks in use seen after any step since start
  // Engine-thread seconds (cumulative) in the model's forward pass, and in steps outside it plus
  // the handling of their outputs (EngineLoop).
  double forward_seconds = 0, host_seconds = 0;
  double prompt_forward_seconds = 0;  // the part of forward_seconds in steps with prompt tokens
  bool kv_full = false;               // above the worker's KV high-water mark
  // Speculative decoding (cumulative, but the last): proposed and kept tokens, sequence-steps that
  // verified, the same per position (1-based position i at [i - 1]), the adaptive policy's
  // decisions (kSpecDecisionNames), and the mean budget of the last speculating step.
  static constexpr int kSpecPositions = 16;
  static constexpr int kSpecDecisions = 5;
  int64_t spec_proposed = 0, spec_accepted = 0, spec_verify_steps = 0;
  std::array<int64_t, kSpecPositions> spec_proposed_at{}, spec_accepted_at{};
  std::array<int64_t, kSpecDecisions> spec_decisions{};
  double spec_k_in_force = 0;
  // Structured output's token masks (cumulative): computed, found cached, seconds spent.
  int64_t structured_masks_computed = 0, structured_masks_cached = 0;
  double structured_mask_seconds = 0;
};

// The adaptive policy's decisions in common/engine/speculation.h's SpecDecision order.
inline constexpr const char* kSpecDecisionNames[EngineSnapshot::kSpecDecisions] = {
    "full", "shrunk_batch", "shrunk_acceptance", "off_batch", "off_acceptance"};

// How a decode worker's KV reservation ended: its transfer landed (the sequence was admitted),
// failed (the prefill side or the link reported an error, or the landed KV could not be admitted),
// timed out
// (--kv-transfer-timeout-s or the call's deadline), or was cancelled (the client, the router, or
// the worker shutting down) while it waited.
enum class KvReservationOutcome { kLanded, kFailed, kTimedOut, kCancelled };
inline constexpr int kNumKvReservationOutcomes = 4;

class WorkerMetrics {
 public:
  explicit WorkerMetrics(Metrics* metrics);

  // One engine step: tokens computed, sequences in the batch, wall time.
  void ObserveStep(int64_t tokens, int64_t sequences, double seconds);
  // Gauges and counters from the latest snapshot (called by the refresher).
  void Refresh(const EngineSnapshot& s);
  // One finished KV transfer (prefill side): bytes sent, seconds from Begin to acknowledgement.
  void ObserveTransfer(int64_t bytes, double seconds, bool ok);
  // One KV reservation ended (decode side), and how.
  void ObserveReservation(KvReservationOutcome outcome);

 private:
  Metrics* m_;
  prometheus::Histogram& batch_tokens_;
  prometheus::Histogram& batch_size_;
  prometheus::Histogram& step_seconds_;
  prometheus::Gauge& waiting_;
  prometheus::Gauge& running_;
  prometheus::Gauge& blocks_used_;
  prometheus::Gauge& blocks_free_;
  prometheus::Gauge& usage_;
  prometheus::Gauge& usage_peak_;
  prometheus::Gauge& pending_transfers_;
  prometheus::Gauge& kv_links_;
  prometheus::Counter& prefix_queries_;
  prometheus::Counter& prefix_hits_;
  prometheus::Counter& preemptions_;
  prometheus::Counter& sampled_device_;
  prometheus::Counter& sampled_host_;
  prometheus::Counter& sampling_row_copies_;
  prometheus::Counter& structured_masks_computed_;  // {source="computed"}
  prometheus::Counter& structured_masks_cached_;    // {source="cached"}
  prometheus::Counter& structured_mask_seconds_;
  // tandem_engine_forward_seconds_total{step="prompt"}
  prometheus::Counter& prompt_forward_seconds_;
  prometheus::Counter& decode_forward_seconds_;  // {step="decode"}
  prometheus::Counter& host_seconds_;
  prometheus::Counter& transfer_bytes_;
  prometheus::Counter& transfer_failures_;
  prometheus::Counter& transfers_;
  prometheus::Histogram& transfer_seconds_;
  prometheus::Counter* reservations_[kNumKvReservationOutcomes];
  prometheus::Counter& spec_proposed_;
  prometheus::Counter& spec_accepted_;
  prometheus::Counter& spec_verify_steps_;
  prometheus::Gauge& spec_k_in_force_;
  prometheus::Counter* spec_proposed_at_[EngineSnapshot::kSpecPositions];
  prometheus::Counter* spec_accepted_at_[EngineSnapshot::kSpecPositions];
  prometheus::Counter* spec_decisions_[EngineSnapshot::kSpecDecisions];
  absl::Mutex mu_;
  EngineSnapshot last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem
