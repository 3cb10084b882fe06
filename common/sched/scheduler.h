// The continuous-batching scheduler: pure logic over SchedRequests and a KvCacheManager, no device
// and no model. Each Schedule() fills a token budget and a sequence cap: running requests first
// (decodes and unfinished prompt chunks, in admission order), then waiting prompts, chunked to
// max_prefill_chunk, so a long prompt never stalls token streams. When blocks run out, the most
// recently admitted running request is preempted by recompute (blocks freed, requeued first).
//
// Roles: kCombined computes prompts and decodes; kPrefill computes prompts and hands a request out
// (blocks kept) once its first token is sampled; kDecode admits requests whose KV arrives from
// elsewhere into reserved blocks. Not thread-safe: the engine's step loop owns it.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/kv/kv_cache_manager.h"
#include "common/sched/request.h"

namespace tandem {

enum class SchedulerRole { kCombined, kPrefill, kDecode };

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;  // token budget of one step
  int64_t max_num_seqs = 128;             // requests in one step
  int64_t max_prefill_chunk = 512;        // prompt tokens of one request per step (0: no limit)
  int64_t max_queued_requests = 1024;     // waiting requests beyond which AddRequest refuses
  int64_t max_model_len = 2048;           // prompt + output tokens
  SchedulerRole role = SchedulerRole::kCombined;
};

// One request's share of a step: tokens [num_computed_tokens, + num_new_tokens) of its token_ids.
struct ScheduledChunk {
  SchedRequest* request = nullptr;
  int64_t num_new_tokens = 0;
  // True when the chunk reaches the end of the known tokens: the step samples its next token.
  bool samples = false;
  // Speculative decoding: the chunk's last num_draft_tokens tokens are the request's draft_tokens
  // (positions num_tokens() onwards), to be verified. Schedule() gives a decoding request with a
  // spec_budget this many slots; the engine shrinks the chunk to what was proposed.
  int64_t num_draft_tokens = 0;
};

struct SchedulerStep {
  std::vector<ScheduledChunk> chunks;
  int64_t num_tokens = 0;
  std::vector<std::string> preempted;  // requests preempted while building this step
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerConfig& config,
                                                           KvCacheManager* kv);

  // Queues a request (prompt in token_ids). Refused at once, before any work:
  // RESOURCE_EXHAUSTED when max_queued_requests are waiting; INVALID_ARGUMENT when the prompt is
  // empty, longer than max_model_len allows, or needs more blocks than the whole pool.
  absl::Status AddRequest(std::unique_ptr<SchedRequest> request);

  // Decode role: reserves blocks for `num_tokens` tokens arriving from a prefill worker for a new
  // request. RESOURCE_EXHAUSTED when the pool cannot hold them (backpressure: no reservation, no
  // prefill). Returns the block table.
  absl::StatusOr<std::vector<int32_t>> Reserve(const std::string& id, int64_t num_tokens);
  // Decode role: admits a request whose prompt KV is in its reserved blocks; token_ids holds the
  // prompt and the first token (sampled by the prefill worker).
  absl::Status AdmitPrefilled(std::unique_ptr<SchedRequest> request);

  SchedulerStep Schedule();
  // Records a computed step. `sampled[i]`: the token of step.chunks[i] when it samples one, else
  // kNotSampled (also for a request the caller finished instead). One entry a chunk.
  // `accepted[i]` (empty: none): how many of a speculating chunk's draft tokens were kept; they
  // join token_ids before the sampled token, the rest are rolled back (computed tokens and the
  // blocks past the request's tokens).
  static constexpr int32_t kNotSampled = -1;
  void Update(const SchedulerStep& step, const std::vector<int32_t>& sampled,
              const std::vector<int32_t>& accepted = {});

  // Ends a request in any state (finished, aborted, failed) and frees its blocks. In the prefill
  // role a request whose prompt is done is handed out instead (blocks kept until Release).
  void Finish(const std::string& id);
  void HandOut(const std::string& id);
  void Release(const std::string& id);

  SchedRequest* Find(const std::string& id);
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  const std::vector<SchedRequest*>& running() const { return running_; }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  const SchedulerConfig& config() const { return config_; }
  KvCacheManager* kv() const { return kv_; }

 private:
  Scheduler(const SchedulerConfig& config, KvCacheManager* kv) : config_(config), kv_(kv) {}
  void Preempt(SchedRequest* r);

  SchedulerConfig config_;
  KvCacheManager* kv_;
  absl::flat_hash_map<std::string, std::unique_ptr<SchedRequest>> requests_;
  std::deque<SchedRequest*> waiting_;
  std::vector<SchedRequest*> running_;  // admission order
  uint64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace tandem
