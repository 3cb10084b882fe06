#include "router/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/file.h"
#include "common/base/logging.h"

namespace tandem::router {
namespace {

constexpr size_t kMinKeyLength = 16;

std::array<unsigned char, 32> Digest(absl::string_view s) {
  std::array<unsigned char, 32> d;
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

// What says the file changed: its modification time, mixed with its size.
int64_t MtimeNs(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  const int64_t ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return ns ^ (static_cast<int64_t>(st.st_size) << 1);
}

// The key file's text; INVALID_ARGUMENT (a flag's bad value) when it cannot be read.
absl::StatusOr<std::string> ReadKeyFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok())
    return absl::InvalidArgumentError(absl::StrCat("API key file: ", text.status().message()));
  return text;
}

}  // namespace

absl::StatusOr<std::vector<ApiKeys::Key>> ApiKeys::Parse(const std::string& text,
                                                         const std::string& source) {
  std::vector<Key> keys;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_number, ": ", why));
    };
    const absl::string_view secret = fields[0];
    if (secret.size() < kMinKeyLength)
      return bad(absl::StrCat("a key must be at least ", kMinKeyLength, " characters"));
    for (char c : secret) {
      if (c < 0x21 || c > 0x7e) return bad("a key is printable ASCII without spaces");
    }
    Key key;
    key.digest = Digest(secret);
    key.name = absl::StrCat("key-", line_number);
    for (size_t i = 1; i < fields.size(); ++i) {
      const size_t eq = fields[i].find('=');
      if (eq == absl::string_view::npos)
        return bad(absl::StrCat("'", fields[i], "' is not name=value"));
      const absl::string_view k = fields[i].substr(0, eq), v = fields[i].substr(eq + 1);
      if (k == "name") {
        if (v.empty()) return bad("empty name");
        key.name = std::string(v);
      } else if (k == "rpm" || k == "tpm") {
        double rate;
        if (!absl::SimpleAtod(v, &rate) || !(rate >= 0) || rate > 1e12)
          return bad(absl::StrCat(k, " must be a number >= 0"));
        (k == "rpm" ? key.requests_per_minute : key.tokens_per_minute) = rate;
      } else {
        return bad(absl::StrCat("unknown field '", k, "' (name, rpm and tpm are known)"));
      }
    }
    for (const Key& other : keys) {
      if (other.name == key.name)
        return bad(absl::StrCat("the name '", key.name, "' is used twice"));
      if (CRYPTO_memcmp(other.digest.data(), key.digest.data(), key.digest.size()) == 0)
        return bad("the same key is listed twice");
    }
    keys.push_back(std::move(key));
  }
  if (keys.empty()) return absl::InvalidArgumentError(absl::StrCat(source, " lists no key"));
  return keys;
}

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::FromText(const std::string& text,
                                                           const std::string& source) {
  absl::StatusOr<std::vector<Key>> keys = Parse(text, source);
  if (!keys.ok()) return keys.status();
  std::unique_ptr<ApiKeys> k(new ApiKeys());
  absl::MutexLock lock(&k->mu_);
  k->keys_ = *std::move(keys);
  return k;
}

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::Load(const std::string& path) {
  const int64_t mtime = MtimeNs(path);
  absl::StatusOr<std::string> text = ReadKeyFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::unique_ptr<ApiKeys>> k = FromText(*text, path);
  if (!k.ok()) return k.status();
  (*k)->path_ = path;
  absl::MutexLock lock(&(*k)->mu_);
  (*k)->mtime_ns_ = mtime;
  (*k)->checked_ = absl::Now();
  return k;
}

void ApiKeys::ReloadIfChanged() {
  if (path_.empty()) return;
  const absl::Time now = absl::Now();
  if (now - checked_ < absl::Seconds(1)) return;
  checked_ = now;
  const int64_t mtime = MtimeNs(path_);
  if (mtime == mtime_ns_) return;
  mtime_ns_ = mtime;
  absl::StatusOr<std::string> text = ReadKeyFile(path_);
  absl::StatusOr<std::vector<Key>> keys =
      text.ok() ? Parse(*text, path_) : absl::StatusOr<std::vector<Key>>(text.status());
  if (!keys.ok()) {
    TANDEM_LOG(ERROR) << "router: keeping the API keys in force: " << keys.status();
    return;
  }
  keys_ = *std::move(keys);
  TANDEM_LOG(INFO) << "router: reloaded " << keys_.size() << " API keys from " << path_;
}

absl::StatusOr<std::string> ApiKeys::Authenticate(std::string_view authorization) {
  absl::string_view credential =
      absl::StripAsciiWhitespace(absl::string_view(authorization.data(), authorization.size()));
  constexpr absl::string_view kBearer = "Bearer ";
  if (credential.size() >= kBearer.size() &&
      absl::EqualsIgnoreCase(credential.substr(0, kBearer.size()), kBearer)) {
    credential = absl::StripLeadingAsciiWhitespace(credential.substr(kBearer.size()));
  } else {
    credential = {};
  }
  if (credential.empty()) {
    return absl::UnauthenticatedError(
        "this server needs an API key: send it as 'authorization: Bearer KEY'");
  }
  const std::array<unsigned char, 32> digest = Digest(credential);
  absl::MutexLock lock(&mu_);
  ReloadIfChanged();
  const Key* match = nullptr;
  for (const Key& k : keys_) {  // every key, no early exit
    const bool equal = CRYPTO_memcmp(k.digest.data(), digest.data(), digest.size()) == 0;
    if (equal) match = &k;
  }
  if (match == nullptr) return absl::UnauthenticatedError("the API key is not valid");
  return match->name;
}

ApiKeys::Bucket* ApiKeys::Refill(const std::string& name, absl::Time now, const Key** key) {
  *key = nullptr;
  for (const Key& k : keys_) {
    if (k.name == name) *key = &k;
  }
  if (*key == nullptr) return nullptr;
  Bucket& b = buckets_[name];
  const double rpm = (*key)->requests_per_minute, tpm = (*key)->tokens_per_minute;
  if (b.refilled == absl::InfinitePast()) {
    b.requests = rpm;
    b.tokens = tpm;
  } else {
    const double minutes = std::max(0.0, absl::ToDoubleSeconds(now - b.refilled) / 60);
    b.requests = std::min(rpm, b.requests + minutes * rpm);
    b.tokens = std::min(tpm, b.tokens + minutes * tpm);
  }
  b.refilled = now;
  return &b;
}

absl::Status ApiKeys::Admit(const std::string& name, int64_t prompt_tokens, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const Key* key;
  Bucket* b = Refill(name, now, &key);
  if (b == nullptr) return absl::UnauthenticatedError("the API key is no longer valid");
  const double rpm = key->requests_per_minute, tpm = key->tokens_per_minute;
  if (rpm > 0 && b->requests < 1) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("API key '%s' is over its limit of %g requests a minute; retry in %.1f s",
                        name, rpm, (1 - b->requests) * 60 / rpm));
  }
  if (tpm > 0 && b->tokens <= 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("API key '%s' is over its limit of %g tokens a minute; retry in %.1f s",
                        name, tpm, (1 - b->tokens) * 60 / tpm));
  }
  if (rpm > 0) b->requests -= 1;
  if (tpm > 0) b->tokens -= static_cast<double>(prompt_tokens);
  return absl::OkStatus();
}

void ApiKeys::Charge(const std::string& name, int64_t tokens, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const Key* key;
  Bucket* b = Refill(name, now, &key);
  if (b != nullptr && key->tokens_per_minute > 0) b->tokens -= static_cast<double>(tokens);
}

size_t ApiKeys::size() const {
  absl::MutexLock lock(&mu_);
  return keys_.size();
}

}  // namespace tandem::router
