// An in-process KvLink for tests of the transport around a side data path, on the CPU. The two ends
// of a pair meet in a shared hub by rendezvous token and hand layers over through a queue with
// NCCL's pairing rules: each send waits until its matching receive took it, sizes must agree, and a
// torn-down or aborted end fails the other's calls. Received layers land through the owner's
// `land`, as the NCCL link's staged receives do. Faults on demand: sends that stall (a hung peer)
// or arrive late, joins that never complete. Counts live links, so tests can see communicators
// created lazily, reused, and torn down.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/kv_cache_storage.h"
#include "common/base/status_macros.h"
#include "common/transport/kv_link.h"

namespace tandem {

class LoopbackKvHub {
 public:
  struct Pair {
    absl::Mutex mu;
    bool joined[2] = {false, false};
    bool aborted = false;
    std::string why;
    // Layers sent and not yet received: [2][blocks][block bytes].
    std::deque<std::vector<char>> queue;
    int64_t sent = 0, taken = 0;
  };
  std::shared_ptr<Pair> Get(const std::string& token) {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Pair>& p = pairs_[token];
    if (!p) p = std::make_shared<Pair>();
    return p;
  }
  std::string NewToken() {
    absl::MutexLock lock(&mu_);
    return absl::StrCat("loopback-", next_++);
  }
  std::atomic<int> live_links{0};
  std::atomic<int> joins{0};
  // Abandon() calls, in order: (token, ranks).
  void RecordAbandoned(const std::string& token, const std::vector<int>& ranks) {
    absl::MutexLock lock(&mu_);
    abandoned_.emplace_back(token, ranks);
  }
  std::vector<std::pair<std::string, std::vector<int>>> abandoned() {
    absl::MutexLock lock(&mu_);
    return abandoned_;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Pair>> pairs_;
  std::vector<std::pair<std::string, std::vector<int>>> abandoned_;
  int next_ = 0;
};

class LoopbackKvLink final : public KvLink {
 public:
  LoopbackKvLink(std::shared_ptr<LoopbackKvHub::Pair> pair, KvCacheStorage* storage,
                 LoopbackKvHub* hub, const std::atomic<bool>* stall_sends,
                 const std::atomic<int>* send_delay_ms)
      : pair_(std::move(pair)),
        storage_(storage),
        hub_(hub),
        stall_sends_(stall_sends),
        send_delay_ms_(send_delay_ms) {
    ++hub_->live_links;
  }
  ~LoopbackKvLink() override {
    Abort("the peer tore the link down");
    --hub_->live_links;
  }

  absl::Status SendLayer(
      int32_t layer, const std::vector<int32_t>& blocks, absl::Duration timeout,
      WorkMark* /*ready: the CPU backend's work is done when enqueued*/) override {
    const absl::Time deadline = absl::Now() + timeout;
    const int64_t e = storage_->geometry().bytes_per_block();
    std::vector<char> data(2 * blocks.size() * e);
    storage_->ReadBlocks(false, layer, blocks, data.data());
    storage_->ReadBlocks(true, layer, blocks, data.data() + blocks.size() * e);
    if (send_delay_ms_->load() > 0) absl::SleepFor(absl::Milliseconds(send_delay_ms_->load()));
    absl::MutexLock lock(&pair_->mu);
    if (pair_->aborted) return absl::UnavailableError(pair_->why);
    if (stall_sends_->load()) {  // a hung peer: nothing moves until the timeout aborts the link
      pair_->mu.AwaitWithDeadline(absl::Condition(&pair_->aborted), deadline);
      if (!pair_->aborted) AbortLocked("send timed out");
      return absl::DeadlineExceededError("loopback link: send timed out");
    }
    pair_->queue.push_back(std::move(data));
    const int64_t mine = ++pair_->sent;
    auto taken_or_aborted = [this, mine]() { return pair_->aborted || pair_->taken >= mine; };
    if (!pair_->mu.AwaitWithDeadline(absl::Condition(&taken_or_aborted), deadline)) {
      AbortLocked("send timed out");
      return absl::DeadlineExceededError("loopback link: send timed out");
    }
    return pair_->taken >= mine ? absl::OkStatus() : absl::UnavailableError(pair_->why);
  }

  absl::Status RecvLayer(int32_t layer, const std::vector<int32_t>& blocks, const Landing& land,
                         absl::Duration timeout) override {
    std::vector<char> data;
    RETURN_IF_ERROR(Take(static_cast<int32_t>(blocks.size()), timeout, &data));
    const int64_t e = storage_->geometry().bytes_per_block();
    land([&] {
      storage_->WriteBlocks(false, layer, blocks, data.data());
      storage_->WriteBlocks(true, layer, blocks, data.data() + blocks.size() * e);
    });
    return absl::OkStatus();
  }

  absl::Status DiscardLayer(int32_t num_blocks, absl::Duration timeout) override {
    std::vector<char> data;
    return Take(num_blocks, timeout, &data);
  }

 private:
  absl::Status Take(int32_t num_blocks, absl::Duration timeout, std::vector<char>* out) {
    absl::MutexLock lock(&pair_->mu);
    auto ready = [this]() { return pair_->aborted || !pair_->queue.empty(); };
    if (!pair_->mu.AwaitWithDeadline(absl::Condition(&ready), absl::Now() + timeout)) {
      AbortLocked("receive timed out");
      return absl::DeadlineExceededError("loopback link: receive timed out");
    }
    if (pair_->aborted) return absl::UnavailableError(pair_->why);
    *out = std::move(pair_->queue.front());
    pair_->queue.pop_front();
    ++pair_->taken;
    const size_t expected =
        2 * static_cast<size_t>(num_blocks) * storage_->geometry().bytes_per_block();
    if (out->size() != expected) {
      AbortLocked("sizes of a send and its receive differ");
      return absl::DataLossError("loopback link: sizes of a send and its receive differ");
    }
    return absl::OkStatus();
  }
  void Abort(const std::string& why) {
    absl::MutexLock lock(&pair_->mu);
    AbortLocked(why);
  }
  void AbortLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pair_->mu) {
    if (pair_->aborted) return;
    pair_->aborted = true;
    pair_->why = absl::StrCat("loopback link: ", why);
  }

  std::shared_ptr<LoopbackKvHub::Pair> pair_;
  KvCacheStorage* storage_;
  LoopbackKvHub* hub_;
  const std::atomic<bool>* stall_sends_;
  const std::atomic<int>* send_delay_ms_;
};

class LoopbackKvLinkFactory final : public KvLinkFactory {
 public:
  // `name`: the data path's name in handshakes (two factories of other names are two data paths).
  LoopbackKvLinkFactory(KvCacheStorage* storage, LoopbackKvHub* hub, std::string name = "loopback")
      : storage_(storage), hub_(hub), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  absl::StatusOr<std::string> NewRendezvous() override { return hub_->NewToken(); }
  absl::StatusOr<std::unique_ptr<KvLink>> Join(const std::string& token, int rank,
                                               absl::Duration timeout) override {
    if (rank != 0 && rank != 1) return absl::InvalidArgumentError("rank must be 0 or 1");
    ++hub_->joins;
    std::shared_ptr<LoopbackKvHub::Pair> pair = hub_->Get(token);
    absl::MutexLock lock(&pair->mu);
    pair->joined[rank] = !never_join_.load();
    auto both = [&pair]() { return pair->joined[0] && pair->joined[1]; };
    if (!pair->mu.AwaitWithDeadline(absl::Condition(&both), absl::Now() + timeout)) {
      pair->joined[rank] = false;
      return absl::DeadlineExceededError("loopback link: the peer did not join in time");
    }
    return std::unique_ptr<KvLink>(
        new LoopbackKvLink(pair, storage_, hub_, &stall_sends_, &send_delay_ms_));
  }

  void Abandon(const std::string& token, const std::vector<int>& ranks) override {
    hub_->RecordAbandoned(token, ranks);
  }

  std::atomic<bool> stall_sends_{false};  // sends hang until their timeout
  std::atomic<int> send_delay_ms_{0};     // sends hand their layer over this late
  std::atomic<bool> never_join_{false};   // this end's joins never complete (for its peer)

 private:
  KvCacheStorage* storage_;
  LoopbackKvHub* hub_;
  std::string name_;
};

}  // namespace tandem
