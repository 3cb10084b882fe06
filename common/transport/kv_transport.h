// KV-cache transfer between a prefill worker (sender) and a decode worker (receiver).
//
// The decode worker reserves blocks for a request and Expect()s its transfer; the prefill worker
// sends each layer's KV blocks as soon as that layer is computed (SendLayer), then End() with the
// first sampled token, which returns once the receiver acknowledged the whole transfer. The
// receiver's Wait() then yields the first token: the sequence can be admitted. Model fingerprint
// and cache geometry are checked at connection time: a mismatch is an error, never garbage KV.
// Every wait has a timeout; a dead peer fails the transfer with UNAVAILABLE or DEADLINE_EXCEEDED
// and never hangs a thread. KV bytes never pass through the router.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/backend/kv_cache_storage.h"

namespace tandem {
namespace v1 {
class KvGeometry;  // tandem/v1/model.proto
}  // namespace v1

// What both ends must agree on.
struct KvEndpointInfo {
  std::string model_fingerprint;
  KvCacheGeometry geometry;  // num_blocks may differ between the two ends
};

// Empty when compatible, else the reason.
std::string KvIncompatibility(const KvEndpointInfo& sender, const KvEndpointInfo& receiver);

// A new capability for one reservation: 128 random bits from the kernel's CSPRNG, in hex.
std::string NewKvCapability();
// Whether a presented capability is the issued one, in time that does not depend on where they
// differ. An empty `issued` accepts anything.
bool KvCapabilityMatches(const std::string& issued, const std::string& presented);

// The geometry (num_blocks aside) as the handshake and the workers' descriptions carry it.
void KvGeometryToProto(const KvCacheGeometry& g, v1::KvGeometry* out);

class KvSender {
 public:
  virtual ~KvSender() = default;
  // `capability`: what the receiver issued for the reservation (KvReceiver::Expect).
  virtual absl::Status Begin(const std::string& request_id, int64_t num_tokens,
                             const std::string& capability) = 0;
  // Sends layer `layer` of `src_blocks` (the sender's block table for the request) from `storage`,
  // once the layer's KV writes are done: the work before `ready` (Backend::Mark, taken when they
  // were enqueued), or with `ready` null every op enqueued on the storage's backend before the
  // call.
  virtual absl::Status SendLayer(const std::string& request_id, int32_t layer,
                                 const std::vector<int32_t>& src_blocks, KvCacheStorage* storage,
                                 WorkMark* ready = nullptr) = 0;
  // Ends the transfer with the first token and waits for the receiver's acknowledgement.
  virtual absl::Status End(const std::string& request_id, int32_t first_token) = 0;
  // False once the connection is known to be gone (the receiver closed it: restarted, or dropped it
  // after an error): a cached sender is then replaced before a new transfer begins on it.
  virtual bool Connected() const { return true; }
};

class KvReceiver {
 public:
  virtual ~KvReceiver() = default;
  // The next transfer of `request_id` lands in `dst_blocks` of the receiver's storage. With a
  // `capability` (NewKvCapability), only a sender whose Begin presents it may write there: a Begin
  // without it is ignored and its data dropped. Empty: any sender (in-process tests).
  virtual absl::Status Expect(const std::string& request_id, std::vector<int32_t> dst_blocks,
                              const std::string& capability) = 0;
  // The first token once every layer of the transfer arrived; DEADLINE_EXCEEDED after `timeout`,
  // UNAVAILABLE when the sender failed. The reservation is forgotten either way.
  virtual absl::StatusOr<int32_t> Wait(const std::string& request_id, absl::Duration timeout) = 0;
  // Forgets a reservation (cancelled request); data still arriving for it is discarded.
  virtual void Cancel(const std::string& request_id) = 0;
  // Called (on a transport thread, without locks held) when an expected transfer completed or
  // failed, so Wait() returns at once. Set before the first Expect().
  using CompletionCallback = std::function<void(const std::string& request_id)>;
  virtual void SetCompletionCallback(CompletionCallback callback) = 0;
};

}  // namespace tandem
