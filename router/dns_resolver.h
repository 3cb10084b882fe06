// Every address a DNS name has, for worker discovery: a Kubernetes headless Service's name resolves
// to one A (or AAAA) record per ready pod, and the router treats each as a worker of its own.
//
// Resolves with c-ares (the resolver gRPC itself uses): the system's configuration
// (/etc/resolv.conf, /etc/hosts) by default, or one DNS server given as IP:PORT (a test's
// stand-in). Blocking, bounded by `timeout`; call it from a thread that may wait.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::router {

// "name:port" → ["ip:port", ...] (IPv6 as "[ip]:port"), sorted, without duplicates. NOT_FOUND when
// the name has no address (a headless Service with no ready pod); UNAVAILABLE when the DNS server
// does not answer; INVALID_ARGUMENT for a malformed target or server.
absl::StatusOr<std::vector<std::string>> ResolveAll(const std::string& target,
                                                    const std::string& dns_server = "",
                                                    absl::Duration timeout = absl::Seconds(2));

}  // namespace tandem::router
