#include "common/rpc/raw_message.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace tandem::rpc {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;

// Messages nested deeper than this are not searched (protobuf's own parser stops at 100).
constexpr int kMaxDepth = 64;

// What a walk over the wire format found.
struct Found {
  bool malformed = false;  // the bytes are not a message (protobuf's parser refuses them too)
  std::string invalid;     // the path of the first string that is not UTF-8
  bool done() const { return malformed || !invalid.empty(); }
};
Found Malformed() {
  Found f;
  f.malformed = true;
  return f;
}
Found InvalidAt(std::string path) {
  Found f;
  f.invalid = std::move(path);
  return f;
}

// Walks one message's fields up to the stream's limit.
Found Walk(google::protobuf::io::CodedInputStream* in, const Descriptor& d,
           const std::string& prefix, int depth) {
  std::map<int, int> seen;  // field number -> occurrences so far (repeated fields' indices)
  while (true) {
    if (in->BytesUntilLimit() == 0) return {};
    const uint32_t tag = in->ReadTag();
    if (tag == 0) return Malformed();
    const int number = WireFormatLite::GetTagFieldNumber(tag);
    const FieldDescriptor* f = d.FindFieldByNumber(number);
    if (f == nullptr ||
        WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED ||
        (f->type() != FieldDescriptor::TYPE_STRING && f->type() != FieldDescriptor::TYPE_MESSAGE)) {
      if (!WireFormatLite::SkipField(in, tag)) return Malformed();
      continue;
    }
    std::string path = absl::StrCat(prefix, f->name());
    const int index = seen[number]++;
    if (f->is_repeated()) absl::StrAppend(&path, "[", index, "]");
    uint32_t length;
    if (!in->ReadVarint32(&length) || length > static_cast<uint32_t>(INT32_MAX)) return Malformed();
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      std::string value;
      if (!in->ReadString(&value, static_cast<int>(length))) return Malformed();
      if (!unicode::IsValidUtf8(value)) return InvalidAt(path);
      continue;
    }
    if (depth >= kMaxDepth) {  // too deep to follow: skipped (protobuf refuses it anyway)
      if (!in->Skip(static_cast<int>(length))) return Malformed();
      continue;
    }
    if (in->BytesUntilLimit() >= 0 && length > static_cast<uint32_t>(in->BytesUntilLimit()))
      return Malformed();
    const auto limit = in->PushLimit(static_cast<int>(length));
    Found inner = Walk(in, *f->message_type(), path + ".", depth + 1);
    if (inner.done()) return inner;
    in->PopLimit(limit);
  }
}

Found WalkBytes(const std::string& bytes, const Descriptor& descriptor) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  const auto limit = in.PushLimit(static_cast<int>(bytes.size()));
  Found found = Walk(&in, descriptor, "", 0);
  in.PopLimit(limit);
  return found;
}

}  // namespace

std::string FindInvalidUtf8Field(const std::string& bytes, const Descriptor& descriptor) {
  return WalkBytes(bytes, descriptor).invalid;
}

absl::Status ParseMessageBytes(const std::string& bytes, google::protobuf::Message* message) {
  message->Clear();
  // The wire format first: protobuf refuses what the walk refuses too, but logs an error line for
  // every string that is not UTF-8 on the way (even in a truncated message), a log a hostile
  // client could flood.
  const Found found = WalkBytes(bytes, *message->GetDescriptor());
  if (!found.invalid.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(found.invalid,
                     " is not valid UTF-8 (string fields must be; send bytes as "
                     "text encoded in UTF-8, or token ids)"));
  }
  if (!found.malformed && message->ParseFromString(bytes)) return absl::OkStatus();
  message->Clear();
  return absl::InvalidArgumentError(absl::StrCat("the request is not a valid ",
                                                 message->GetDescriptor()->full_name(),
                                                 " (malformed protobuf encoding)"));
}

absl::Status ParseRawMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::InvalidArgumentError("unreadable request bytes");
  std::string bytes;
  bytes.reserve(buffer.Length());
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return ParseMessageBytes(bytes, message);
}

grpc::ByteBuffer ToByteBuffer(const google::protobuf::Message& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace tandem::rpc
