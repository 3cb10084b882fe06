#include "prefill_worker/kv_transfer_lanes.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/transport/kv_control.h"

namespace tandem {

KvTransferLanes::~KvTransferLanes() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  for (auto& [address, lane] : lanes_) lane->thread.join();
  for (auto& lane : retired_) lane->thread.join();
}

size_t KvTransferLanes::lanes() {
  absl::MutexLock lock(&mu_);
  return lanes_.size();
}

void KvTransferLanes::Begin(const std::string& address, const std::string& id, int64_t num_tokens,
                            const std::string& capability) {
  Job j;
  j.kind = Job::kBegin;
  j.id = id;
  j.num_tokens = num_tokens;
  j.capability = capability;
  Enqueue(address, std::move(j));
}

void KvTransferLanes::SendLayer(const std::string& address, const std::string& id, int32_t layer,
                                std::vector<int32_t> blocks, std::shared_ptr<WorkMark> ready) {
  Job j;
  j.kind = Job::kLayer;
  j.id = id;
  j.layer = layer;
  j.blocks = std::move(blocks);
  j.ready = std::move(ready);
  Enqueue(address, std::move(j));
}

void KvTransferLanes::End(const std::string& address, const std::string& id, int32_t first_token,
                          Done done) {
  Job j;
  j.kind = Job::kEnd;
  j.id = id;
  j.first_token = first_token;
  j.done = std::move(done);
  Enqueue(address, std::move(j));
}

void KvTransferLanes::Cancel(const std::string& id) {
  absl::MutexLock lock(&mu_);
  cancelled_.insert(id);
}

void KvTransferLanes::Enqueue(const std::string& address, Job job) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    if (job.done) job.done(absl::UnavailableError("worker shutting down"), 0);
    return;
  }
  for (auto& retired : retired_) retired->thread.join();  // (each has left Run, or is about to)
  retired_.clear();
  std::unique_ptr<Lane>& lane = lanes_[address];
  if (!lane) {
    lane = std::make_unique<Lane>();
    lane->address = address;
    lane->thread = std::thread([this, l = lane.get()] { Run(l); });
  }
  lane->jobs.push_back(std::move(job));
  changed_.SignalAll();
}

absl::Status KvTransferLanes::Execute(Lane* lane, const Job& job) {
  // A cached connection the decode worker has closed since (it restarted, or dropped it after an
  // error) is replaced before a transfer begins on it, instead of failing that transfer.
  if (job.kind == Job::kBegin) {
    DropIfDisconnected(lane, absl::UnavailableError("the decode worker closed the connection"));
  }
  if (lane->sender == nullptr) {
    std::string refused;
    auto sender = KvControlSender::ConnectFirst(lane->address, options_.info, options_.io_timeout,
                                                options_.data_paths, &refused, options_.tls.get());
    if (!sender.ok()) return sender.status();
    if (!refused.empty()) {
      TANDEM_LOG(WARNING) << "KV connection to " << lane->address << ": layers go over "
                          << (*sender)->data_path() << " (" << refused << ")";
    }
    lane->sender = *std::move(sender);
  }
  switch (job.kind) {
    case Job::kBegin:
      lane->begun.insert(job.id);
      return lane->sender->Begin(job.id, job.num_tokens, job.capability);
    case Job::kLayer:
      return lane->sender->SendLayer(job.id, job.layer, job.blocks, options_.storage,
                                     job.ready.get());
    case Job::kEnd: return lane->sender->End(job.id, job.first_token);
  }
  return absl::InternalError("unknown job");
}

void KvTransferLanes::Run(Lane* lane) {
  absl::Time idle_since = absl::Now();
  while (true) {
    Job job;
    bool cancelled;
    bool idle;
    {
      absl::MutexLock lock(&mu_);
      bool timed_out = false;
      while (lane->jobs.empty() && !stopping_ && !timed_out) {
        timed_out = changed_.WaitWithTimeout(&mu_, options_.idle_check);
      }
      if (stopping_) {  // fail what is left without sending
        for (Job& j : lane->jobs) {
          if (j.done) j.done(absl::UnavailableError("worker shutting down"), 0);
        }
        lane->jobs.clear();
        return;
      }
      idle = lane->jobs.empty();
      // (The connection's state only changes on this thread; the lock guards the queue.)
      if (idle && lane->sender == nullptr &&
          absl::Now() - idle_since >= options_.retire_idle_lane) {
        auto it = lanes_.find(lane->address);
        retired_.push_back(std::move(it->second));  // joined by the next Enqueue or the destructor
        lanes_.erase(it);
        return;
      }
      if (!idle) {
        job = std::move(lane->jobs.front());
        lane->jobs.pop_front();
        cancelled = cancelled_.contains(job.id);
        if (cancelled && job.kind == Job::kEnd) cancelled_.erase(job.id);
      }
    }
    if (idle) {
      DropIfDisconnected(lane, absl::UnavailableError("the decode worker closed the connection"));
      continue;
    }
    if (job.kind == Job::kBegin) lane->started[job.id] = absl::Now();
    absl::Status status;
    auto failed = lane->failed.find(job.id);
    if (cancelled) {
      status = absl::CancelledError("cancelled");
    } else if (failed != lane->failed.end()) {
      status = failed->second;
      // A layer failed short of the wire (the connection is sound): the End still goes out, so the
      // receiver fails the reservation now (layers missing) instead of at its transfer timeout.
      if (job.kind == Job::kEnd && lane->begun.contains(job.id) && lane->sender != nullptr) {
        DropIfDisconnected(lane, lane->sender->End(job.id, job.first_token));
      }
    } else {
      status = Execute(lane, job);
      if (status.ok() && job.kind == Job::kLayer && job.layer == options_.fault_stop_after_layer &&
          !fault_fired_.exchange(true)) {
        TANDEM_LOG(WARNING) << "--fault-stop-after-kv-layer: layer " << job.layer << " of "
                            << job.id << " sent; stopping this process (SIGSTOP) mid-transfer";
        ::raise(SIGSTOP);
      }
      if (!status.ok()) {
        const absl::Status cause = status;
        status = absl::UnavailableError(
            absl::StrCat("KV transfer to ", lane->address, " failed: ", cause.message()));
        lane->failed[job.id] = status;
        DropIfDisconnected(lane, cause);
      }
    }
    if (job.kind == Job::kEnd) {
      lane->begun.erase(job.id);
      double seconds = 0;
      if (auto it = lane->started.find(job.id); it != lane->started.end()) {
        seconds = absl::ToDoubleSeconds(absl::Now() - it->second);
        lane->started.erase(it);
      }
      lane->failed.erase(job.id);
      job.done(status, seconds);
    }
    idle_since = absl::Now();
  }
}

void KvTransferLanes::DropIfDisconnected(Lane* lane, const absl::Status& cause) {
  if (lane->sender == nullptr || lane->sender->Connected()) return;
  lane->sender.reset();
  for (const std::string& id : lane->begun) {
    lane->failed.try_emplace(id, absl::UnavailableError(absl::StrCat(
                                     "KV transfer to ", lane->address,
                                     " failed: the connection was lost (", cause.message(), ")")));
  }
  lane->begun.clear();
}

}  // namespace tandem
