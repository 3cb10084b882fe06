#include "common/metrics/metrics.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace tandem {

int64_t ResidentMemoryBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

std::vector<double> Metrics::LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120};
}

std::vector<double> Metrics::TokenLatencyBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
          0.1,    0.15,  0.2,    0.3,   0.5,  1,    2.5,  5};
}

std::vector<double> Metrics::CountBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
}

Metrics::Metrics(const Options& options)
    : options_(options), registry_(std::make_shared<prometheus::Registry>()) {}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const Options& options) {
  std::unique_ptr<Metrics> m(new Metrics(options));
  if (!options.listen_address.empty()) {
    try {
      m->exposer_ =
          std::make_unique<prometheus::Exposer>(options.listen_address, /*num_threads=*/1);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("metrics: cannot listen on ", options.listen_address, ": ", e.what()));
    }
    m->exposer_->RegisterCollectable(m->registry_);
    const std::vector<int> ports = m->exposer_->GetListeningPorts();
    if (!ports.empty()) m->port_ = ports[0];
  }
  prometheus::Gauge& rss =
      m->Gauge("tandem_process_resident_memory_bytes", "Resident set size of the process.");
  m->OnRefresh([&rss] { rss.Set(static_cast<double>(ResidentMemoryBytes())); });
  m->refresher_ = std::thread([p = m.get()] {
    do {
      p->Refresh();
    } while (!p->stop_.WaitForNotificationWithTimeout(p->options_.refresh_interval));
  });
  return m;
}

Metrics::~Metrics() {
  stop_.Notify();
  if (refresher_.joinable()) refresher_.join();
  exposer_.reset();
}

Metrics::Labels Metrics::With(const Labels& labels) const {
  Labels l = labels;
  l["model"] = options_.model;
  l["role"] = options_.role;
  return l;
}

prometheus::Counter& Metrics::Counter(const std::string& name, const std::string& help,
                                      const Labels& labels) {
  absl::MutexLock lock(&families_mu_);
  auto*& f = counters_[name];
  if (f == nullptr) f = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  return f->Add(With(labels));
}

prometheus::Gauge& Metrics::Gauge(const std::string& name, const std::string& help,
                                  const Labels& labels) {
  absl::MutexLock lock(&families_mu_);
  auto*& f = gauges_[name];
  if (f == nullptr) f = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  return f->Add(With(labels));
}

prometheus::Histogram& Metrics::Histogram(const std::string& name, const std::string& help,
                                          const std::vector<double>& buckets,
                                          const Labels& labels) {
  absl::MutexLock lock(&families_mu_);
  auto*& f = histograms_[name];
  if (f == nullptr) f = &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
  return f->Add(With(labels), buckets);
}

void Metrics::OnRefresh(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  refreshers_.push_back(std::move(fn));
}

void Metrics::Refresh() {
  std::vector<std::function<void()>> fns;
  {
    absl::MutexLock lock(&mu_);
    fns = refreshers_;
  }
  for (auto& fn : fns) fn();
}

void Metrics::SetBuildInfo(const std::string& backend, const std::string& device) {
  Gauge("tandem_build_info", "Build and device of the process (value 1).",
        {{"version", TANDEM_VERSION},
         {"git_sha", TANDEM_GIT_SHA},
         {"backend", backend},
         {"device", device}})
      .Set(1);
}

std::string Metrics::Text() {
  Refresh();
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace tandem
