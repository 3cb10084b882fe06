// Requests served raw (as grpc::ByteBuffer) and parsed by the handler, so that a message protobuf
// refuses to parse becomes INVALID_ARGUMENT with a reason instead of the UNIMPLEMENTED with an
// empty message that gRPC's generated handlers answer before any of Tandem's code runs. The usual
// cause is a proto3 `string` field that is not valid UTF-8 (or holds an encoded lone surrogate):
// the error names that field by its path ("prompt", "chat.messages[2].content").
#pragma once

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace tandem::rpc {

// Parses `buffer` into `message` (cleared first). INVALID_ARGUMENT naming the field for a string
// that is not valid UTF-8, or saying the bytes are not a valid message of the type.
absl::Status ParseRawMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);
// The same on serialized bytes.
absl::Status ParseMessageBytes(const std::string& bytes, google::protobuf::Message* message);
// The path of the first string field of `bytes` (wire format of `descriptor`'s type) that is not
// valid UTF-8, or "" when none is found.
std::string FindInvalidUtf8Field(const std::string& bytes,
                                 const google::protobuf::Descriptor& descriptor);
// `message` serialized into a byte buffer (what a raw method's response or write carries).
grpc::ByteBuffer ToByteBuffer(const google::protobuf::Message& message);

}  // namespace tandem::rpc
