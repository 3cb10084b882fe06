#include "router/dns_resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/select.h>

#include <algorithm>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::router {
namespace {

struct Lookup {
  bool done = false;
  int status = ARES_SUCCESS;
  std::vector<std::string> ips;  // "a.b.c.d" or "[v6]"
};

void OnResult(void* arg, int status, int /*timeouts*/, struct ares_addrinfo* result) {
  auto* l = static_cast<Lookup*>(arg);
  l->done = true;
  l->status = status;
  if (result == nullptr) return;
  for (ares_addrinfo_node* n = result->nodes; n != nullptr; n = n->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (n->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(n->ai_addr)->sin_addr, text, sizeof text);
      l->ips.emplace_back(text);
    } else if (n->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(n->ai_addr)->sin6_addr, text,
                sizeof text);
      l->ips.push_back(absl::StrCat("[", text, "]"));
    }
  }
  ares_freeaddrinfo(result);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveAll(const std::string& target,
                                                    const std::string& dns_server,
                                                    absl::Duration timeout) {
  const size_t colon = target.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(target.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", target, "' is not NAME:PORT (a DNS name and a port)"));
  }
  const std::string name = target.substr(0, colon);
  static std::once_flag init;
  std::call_once(init, [] { ares_library_init(ARES_LIB_INIT_ALL); });
  ares_options options{};
  options.timeout =
      static_cast<int>(std::max<int64_t>(100, absl::ToInt64Milliseconds(timeout) / 2));
  options.tries = 2;
  ares_channel channel = nullptr;
  if (ares_init_options(&channel, &options, ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES) != ARES_SUCCESS) {
    return absl::InternalError("c-ares: cannot initialise a resolver");
  }
  struct Closer {
    ares_channel c;
    ~Closer() { ares_destroy(c); }
  } closer{channel};
  if (!dns_server.empty() &&
      ares_set_servers_ports_csv(channel, dns_server.c_str()) != ARES_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat("DNS server '", dns_server, "' is not IP:PORT"));
  }
  ares_addrinfo_hints hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  Lookup lookup;
  ares_getaddrinfo(channel, name.c_str(), nullptr, &hints, OnResult, &lookup);
  const absl::Time deadline = absl::Now() + timeout;
  while (!lookup.done) {
    fd_set readers, writers;
    FD_ZERO(&readers);
    FD_ZERO(&writers);
    const int nfds = ares_fds(channel, &readers, &writers);
    if (nfds == 0) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    timeval max = absl::ToTimeval(std::min(left, absl::Milliseconds(100)));
    timeval tv;
    timeval* wait = ares_timeout(channel, &max, &tv);
    select(nfds, &readers, &writers, nullptr, wait);
    ares_process(channel, &readers, &writers);
  }
  if (!lookup.done) {
    return absl::UnavailableError(absl::StrCat("DNS lookup of '", name, "' timed out"));
  }
  if (lookup.status == ARES_ENOTFOUND || lookup.status == ARES_ENODATA ||
      (lookup.status == ARES_SUCCESS && lookup.ips.empty())) {
    return absl::NotFoundError(absl::StrCat("'", name, "' has no address"));
  }
  if (lookup.status != ARES_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat("DNS lookup of '", name, "': ", ares_strerror(lookup.status)));
  }
  std::vector<std::string> out;
  for (const std::string& ip : lookup.ips) out.push_back(absl::StrCat(ip, ":", port));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace tandem::router
