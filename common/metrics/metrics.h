// One Metrics object per process over a prometheus::Registry, served at GET /metrics on
// --metrics-port. Conventions (../shared/BRIEF.md): prefix tandem_, base units, counters end in
// _total, hit rates as two counters, labels `model` and `role` on every family (added here).
// Families are created on first use and shared by name. A refresher thread runs the registered
// callbacks every `refresh_interval` (gauges derived from engine state, process memory), so
// services need not update gauges on their hot paths.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

class Metrics {
 public:
  using Labels = std::map<std::string, std::string>;
  struct Options {
    std::string model;  // label on every family
    std::string role;   // "router", "prefill", "decode", "combined"
    // "host:port" to serve /metrics on; empty = not served (tests read the registry directly).
    std::string listen_address;
    absl::Duration refresh_interval = absl::Milliseconds(500);
  };
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const Options& options);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  prometheus::Counter& Counter(const std::string& name, const std::string& help,
                               const Labels& labels = {});
  prometheus::Gauge& Gauge(const std::string& name, const std::string& help,
                           const Labels& labels = {});
  prometheus::Histogram& Histogram(const std::string& name, const std::string& help,
                                   const std::vector<double>& buckets, const Labels& labels = {});
  // Runs `fn` on the refresher thread every refresh interval (and once before each text dump).
  void OnRefresh(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);
  // tandem_build_info{version, git_sha, backend, device} = 1.
  void SetBuildInfo(const std::string& backend, const std::string& device);
  // The exposition text, as GET /metrics serves it.
  std::string Text();
  int port() const { return port_; }

  // Seconds: 1 ms … 120 s.
  static std::vector<double> LatencyBuckets();
  // Small latencies (per token): 0.5 ms … 5 s.
  static std::vector<double> TokenLatencyBuckets();
  // Counts (batch tokens, sequences): 1 … 16384.
  static std::vector<double> CountBuckets();

 private:
  explicit Metrics(const Options& options);
  Labels With(const Labels& labels) const;
  void Refresh() ABSL_LOCKS_EXCLUDED(mu_);

  Options options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  absl::Mutex families_mu_;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters_
      ABSL_GUARDED_BY(families_mu_);
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges_
      ABSL_GUARDED_BY(families_mu_);
  std::map<std::string, prometheus::Family<prometheus::Histogram>*> histograms_
      ABSL_GUARDED_BY(families_mu_);
  absl::Mutex mu_;
  std::vector<std::function<void()>> refreshers_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread refresher_;
};

// Resident set size of this process in bytes (from /proc/self/statm; 0 when unavailable).
int64_t ResidentMemoryBytes();

}  // namespace tandem
