#include "common/sched/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerConfig& c,
                                                             KvCacheManager* kv) {
  if (kv == nullptr) return absl::InvalidArgumentError("scheduler needs a KV cache manager");
  if (c.max_num_batched_tokens <= 0 || c.max_num_seqs <= 0 || c.max_prefill_chunk < 0 ||
      c.max_queued_requests < 0 || c.max_model_len <= 1) {
    return absl::InvalidArgumentError(
        "scheduler limits must be positive (max_num_batched_tokens, max_num_seqs, max_model_len > "
        "1)");
  }
  return std::unique_ptr<Scheduler>(new Scheduler(c, kv));
}

absl::Status Scheduler::AddRequest(std::unique_ptr<SchedRequest> r) {
  if (requests_.contains(r->id)) {
    return absl::AlreadyExistsError(absl::StrCat("request id \"", r->id, "\" is already in use"));
  }
  if (static_cast<int64_t>(waiting_.size()) >= config_.max_queued_requests) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many queued requests (", waiting_.size(),
        " waiting, limit --max-queued-requests=", config_.max_queued_requests, "); retry later"));
  }
  if (r->token_ids.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  if (r->num_tokens() >= config_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", r->num_tokens(), " tokens leaves no room to generate within the context of ",
        config_.max_model_len, " tokens"));
  }
  // A request must fit the whole pool on its own at its longest, or preemption could cycle forever.
  const int64_t longest =
      std::min(r->num_tokens() + std::max<int64_t>(r->max_tokens, 1), config_.max_model_len);
  const int64_t need = kv_->BlocksFor(longest);
  if (need > kv_->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", r->num_tokens(), " tokens with up to ", r->max_tokens, " more needs ", need,
        " KV blocks but the whole cache has ", kv_->num_blocks()));
  }
  r->prompt_len = r->num_tokens();
  r->num_computed_tokens = 0;
  r->state = RequestState::kWaiting;
  r->arrival = next_arrival_++;
  SchedRequest* raw = r.get();
  requests_.emplace(r->id, std::move(r));
  waiting_.push_back(raw);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Scheduler::Reserve(const std::string& id, int64_t num_tokens) {
  if (requests_.contains(id) || kv_->Has(id)) {
    return absl::AlreadyExistsError(absl::StrCat("request id \"", id, "\" already holds blocks"));
  }
  if (num_tokens <= 0 || num_tokens >= config_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("cannot reserve ", num_tokens, " tokens"));
  }
  if (!kv_->Allocate(id, num_tokens)) {
    return absl::ResourceExhaustedError(absl::StrCat("no KV blocks for ", num_tokens, " tokens (",
                                                     kv_->num_free_blocks(), " blocks free)"));
  }
  return kv_->BlockTable(id);
}

absl::Status Scheduler::AdmitPrefilled(std::unique_ptr<SchedRequest> r) {
  if (!kv_->Has(r->id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("request \"", r->id, "\" has no reserved blocks"));
  }
  if (r->prompt_len <= 0 || r->num_tokens() != r->prompt_len + 1) {
    return absl::InvalidArgumentError(
        "a prefilled request carries its prompt and exactly one sampled token");
  }
  r->num_computed_tokens = r->prompt_len;
  r->state = RequestState::kRunning;
  r->arrival = next_arrival_++;
  SchedRequest* raw = r.get();
  requests_.emplace(r->id, std::move(r));
  running_.push_back(raw);
  return absl::OkStatus();
}

void Scheduler::Preempt(SchedRequest* r) {
  kv_->Free(r->id);
  r->draft_tokens.clear();
  r->spec_budget = 0;
  r->num_computed_tokens = 0;
  r->num_cached_tokens = 0;
  r->state = RequestState::kPreempted;
  ++r->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(r);
}

SchedulerStep Scheduler::Schedule() {
  SchedulerStep step;
  int64_t budget = config_.max_num_batched_tokens;
  auto chunk_of = [&](const SchedRequest* r, int64_t computed) {
    int64_t n = r->num_tokens() - computed;
    if (config_.max_prefill_chunk > 0 && n > 1) n = std::min(n, config_.max_prefill_chunk);
    return std::min(n, budget);
  };

  // 1. Running requests, in admission order.
  std::vector<SchedRequest*> scheduled_running;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    SchedRequest* r = running_[i];
    const int64_t n = chunk_of(r, r->num_computed_tokens);
    if (n <= 0) {
      ++i;
      continue;
    }
    bool ok = kv_->Allocate(r->id, r->num_computed_tokens + n);
    while (!ok) {
      // Preempt the most recently admitted running request that is not already in this step.
      SchedRequest* victim = running_.back();
      running_.pop_back();
      Preempt(victim);
      step.preempted.push_back(victim->id);
      if (victim == r) break;
      ok = kv_->Allocate(r->id, r->num_computed_tokens + n);
    }
    if (!ok) break;  // r itself was preempted: nothing after it can run either
    step.chunks.push_back({r, n, r->num_computed_tokens + n == r->num_tokens()});
    step.num_tokens += n;
    budget -= n;
    ++i;
  }

  // 1b. Room for speculating decoders' proposals, from what the running requests left of the
  // budget and the pool: proposals never preempt anyone nor push anyone's token out of a step.
  for (ScheduledChunk& ch : step.chunks) {
    SchedRequest* r = ch.request;
    if (budget <= 0) break;
    if (r->spec_budget <= 0 || ch.num_new_tokens != 1 ||
        r->num_computed_tokens != r->num_tokens() - 1)
      continue;
    const int64_t slots = std::min<int64_t>(
        {r->spec_budget, budget, config_.max_model_len - r->num_tokens() - 1,
         config_.max_prefill_chunk > 0 ? config_.max_prefill_chunk - 1 : int64_t{r->spec_budget}});
    if (slots <= 0 || !kv_->Allocate(r->id, r->num_computed_tokens + 1 + slots)) continue;
    ch.num_new_tokens += slots;
    ch.num_draft_tokens = slots;
    step.num_tokens += slots;
    budget -= slots;
  }

  // 2. Waiting requests, oldest (or preempted) first, unless this step had to preempt.
  while (step.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    SchedRequest* r = waiting_.front();
    PrefixCacheHit hit =
        r->use_prefix_cache ? kv_->FindCachedPrefix(r->token_ids) : PrefixCacheHit{};
    const int64_t n = chunk_of(r, hit.num_tokens);
    if (n <= 0 || !kv_->Allocate(r->id, hit.num_tokens + n, hit)) break;
    waiting_.pop_front();
    r->num_computed_tokens = hit.num_tokens;
    r->num_cached_tokens = hit.num_tokens;
    r->state = RequestState::kRunning;
    running_.push_back(r);
    step.chunks.push_back({r, n, r->num_computed_tokens + n == r->num_tokens()});
    step.num_tokens += n;
    budget -= n;
  }
  return step;
}

void Scheduler::Update(const SchedulerStep& step, const std::vector<int32_t>& sampled,
                       const std::vector<int32_t>& accepted) {
  for (size_t i = 0; i < step.chunks.size(); ++i) {
    const ScheduledChunk& c = step.chunks[i];
    SchedRequest* r = c.request;
    if (r->state != RequestState::kRunning) continue;  // finished or preempted meanwhile
    const int64_t kept =
        std::clamp<int64_t>(i < accepted.size() ? accepted[i] : 0, 0,
                            std::min<int64_t>(c.num_draft_tokens, r->draft_tokens.size()));
    r->num_computed_tokens += c.num_new_tokens - (c.num_draft_tokens - kept);
    r->token_ids.insert(r->token_ids.end(), r->draft_tokens.begin(),
                        r->draft_tokens.begin() + kept);
    kv_->CacheComputedBlocks(r->id, r->token_ids, r->num_computed_tokens);
    if (c.samples && i < sampled.size() && sampled[i] != kNotSampled)
      r->token_ids.push_back(sampled[i]);
    if (c.num_draft_tokens > 0 || r->spec_budget > 0) kv_->Truncate(r->id, r->num_tokens());
    r->draft_tokens.clear();
  }
}

void Scheduler::Finish(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    kv_->Free(id);  // a reservation that never became a request
    return;
  }
  SchedRequest* r = it->second.get();
  std::erase(running_, r);
  std::erase(waiting_, r);
  kv_->Free(id);
  requests_.erase(it);
}

void Scheduler::HandOut(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  SchedRequest* r = it->second.get();
  std::erase(running_, r);
  std::erase(waiting_, r);
  r->state = RequestState::kHandedOut;
}

void Scheduler::Release(const std::string& id) { Finish(id); }

SchedRequest* Scheduler::Find(const std::string& id) {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

}  // namespace tandem
