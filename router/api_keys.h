// API keys for the router's client-facing front doors (the gRPC Generation service and the HTTP
// API), with per-key request and token rate limits.
//
// The key file: one key per line, `KEY [name=NAME] [rpm=N] [tpm=N]`, `#` starts a comment. KEY is
// at least 16 printable characters without spaces; NAME (default: "key-<line>") labels the key in
// logs and metrics, never the key itself; rpm / tpm cap requests and tokens (prompt plus generated)
// a minute, 0 or absent for no cap. The file is re-read when it changes (checked at most once a
// second); a file that does not parse keeps the keys in force and logs why.
//
// Keys are held as SHA-256 digests and a presented key's digest is compared with every one without
// an early exit, so the time an answer takes says nothing about how close a guess was. Limits are
// token buckets holding a minute's worth, refilled continuously: a request is admitted while the
// key has a request left and its token bucket is not empty; its prompt tokens are charged at
// admission and its generated tokens when it ends (so one long request can overdraw the bucket,
// and the key's next requests wait until it refills).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::router {

class ApiKeys {
 public:
  // Reads and parses `path`; INVALID_ARGUMENT naming the line for a bad file.
  static absl::StatusOr<std::unique_ptr<ApiKeys>> Load(const std::string& path);
  // Parses key-file text (`source` names it in errors); no reloading.
  static absl::StatusOr<std::unique_ptr<ApiKeys>> FromText(const std::string& text,
                                                           const std::string& source);

  // The credential of an `Authorization: Bearer KEY` header or metadata value → the key's name;
  // UNAUTHENTICATED without one or for an unknown key.
  absl::StatusOr<std::string> Authenticate(std::string_view authorization);
  // Admits one request of `prompt_tokens` for key `name` and charges it; RESOURCE_EXHAUSTED (with
  // when to retry) past the key's limits.
  absl::Status Admit(const std::string& name, int64_t prompt_tokens, absl::Time now = absl::Now());
  // Charges tokens generated for key `name`.
  void Charge(const std::string& name, int64_t tokens, absl::Time now = absl::Now());
  size_t size() const;

 private:
  struct Key {
    std::array<unsigned char, 32> digest;
    std::string name;
    double requests_per_minute = 0, tokens_per_minute = 0;
  };
  struct Bucket {
    double requests = 0, tokens = 0;
    absl::Time refilled = absl::InfinitePast();
  };
  ApiKeys() = default;
  static absl::StatusOr<std::vector<Key>> Parse(const std::string& text, const std::string& source);
  void ReloadIfChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bucket of key `name` refilled to `now` (null for a name no longer in the file).
  Bucket* Refill(const std::string& name, absl::Time now, const Key** key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::string path_;  // "" for FromText
  int64_t mtime_ns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<Key> keys_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router
