#include "common/backend/cuda/op_profiler.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tandem::cuda {

OpProfiler::~OpProfiler() {
  for (const Pending& p : pending_) {
    cudaEventDestroy(p.start);
    cudaEventDestroy(p.end);
  }
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t OpProfiler::NewEvent() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return e;
}

void OpProfiler::Begin(const std::string& name, int64_t bytes, cudaStream_t stream) {
  Pending p{name, bytes, NewEvent(), NewEvent()};
  if (p.start != nullptr) cudaEventRecord(p.start, stream);
  pending_.push_back(std::move(p));
}

void OpProfiler::End(cudaStream_t stream) {
  if (pending_.empty()) return;
  if (pending_.back().end != nullptr) cudaEventRecord(pending_.back().end, stream);
}

void OpProfiler::Collect() {
  for (const Pending& p : pending_) {
    float ms = 0;
    if (p.start != nullptr && p.end != nullptr &&
        cudaEventElapsedTime(&ms, p.start, p.end) == cudaSuccess) {
      Total& t = totals_[p.name];
      ++t.calls;
      t.ms += ms;
      t.bytes += static_cast<double>(p.bytes);
    } else {
      cudaGetLastError();  // an event that never ran (an op refused before its launch): not counted
    }
    if (p.start != nullptr) free_.push_back(p.start);
    if (p.end != nullptr) free_.push_back(p.end);
  }
  pending_.clear();
}

void OpProfiler::Reset() {
  Collect();
  totals_.clear();
}

std::string OpProfiler::Report() const {
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double all = 0;
  int width = 36;  // the name column: as wide as the longest name
  for (const auto& [name, t] : rows) {
    all += t.ms;
    width = std::max(width, static_cast<int>(name.size()));
  }
  std::string out = absl::StrFormat("%-*s %7s %10s %6s %9s %8s\n", width, "op", "calls", "total ms",
                                    "share", "mean us", "GB/s");
  for (const auto& [name, t] : rows) {
    const std::string gbs =
        t.bytes > 0 && t.ms > 0 ? absl::StrFormat("%.0f", t.bytes / (t.ms * 1e-3) / 1e9) : "";
    out += absl::StrFormat("%-*s %7d %10.3f %5.1f%% %9.2f %8s\n", width, name, t.calls, t.ms,
                           all > 0 ? 100 * t.ms / all : 0, t.calls > 0 ? 1e3 * t.ms / t.calls : 0,
                           gbs);
  }
  out += absl::StrFormat("%-*s %7s %10.3f\n", width, "all ops", "", all);
  return out;
}

}  // namespace tandem::cuda
