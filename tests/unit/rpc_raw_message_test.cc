// Raw request parsing (common/rpc/raw_message.h): what protobuf refuses becomes a reason naming the
// field, and valid messages parse as ParseFromString does.
#include "common/rpc/raw_message.h"

#include "gtest/gtest.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::rpc {
namespace {

// Serialized as a client would send it (protobuf only logs invalid UTF-8 when serializing).
std::string Bytes(const google::protobuf::Message& m) { return m.SerializeAsString(); }

TEST(RawMessageTest, AValidRequestParsesAsProtobufDoes) {
  v1::GenerateRequest r;
  r.set_prompt("héllo ✓ 😀");
  r.mutable_sampling()->add_stop("✓");
  r.set_model("m");
  v1::GenerateRequest parsed;
  ASSERT_TRUE(ParseMessageBytes(Bytes(r), &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), r.SerializeAsString());
  EXPECT_EQ(FindInvalidUtf8Field(Bytes(r), *r.GetDescriptor()), "");
  // Through a byte buffer too.
  v1::GenerateRequest again;
  ASSERT_TRUE(ParseRawMessage(ToByteBuffer(r), &again).ok());
  EXPECT_EQ(again.prompt(), r.prompt());
}

TEST(RawMessageTest, InvalidUtf8IsNamedByItsFieldPath) {
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest&)> set;
    std::string path;
  };
  const std::vector<Case> cases = {
      {"a stray continuation byte", [](auto& r) { r.set_prompt("ab\x80"); }, "prompt"},
      {"0xFF", [](auto& r) { r.set_prompt("\xff"); }, "prompt"},
      {"an encoded lone surrogate", [](auto& r) { r.set_prompt("a\xED\xA0\x80z"); }, "prompt"},
      {"an overlong NUL", [](auto& r) { r.set_prompt("\xC0\x80"); }, "prompt"},
      {"a truncated sequence", [](auto& r) { r.set_prompt("\xE2\x9C"); }, "prompt"},
      {"the second stop string",
       [](auto& r) {
         r.set_prompt("ok");
         r.mutable_sampling()->add_stop("fine");
         r.mutable_sampling()->add_stop("\xfe");
       },
       "sampling.stop[1]"},
      {"a chat message's content",
       [](auto& r) {
         auto* chat = r.mutable_chat();
         chat->add_messages()->set_content("hi");
         chat->add_messages()->set_content("bad \xF5\x80\x80\x80");
       },
       "chat.messages[1].content"},
      {"the request id", [](auto& r) { r.set_request_id("id\xC3"); }, "request_id"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r;
    c.set(r);
    EXPECT_EQ(FindInvalidUtf8Field(Bytes(r), *r.GetDescriptor()), c.path) << c.name;
    v1::GenerateRequest parsed;
    const absl::Status s = ParseMessageBytes(Bytes(r), &parsed);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(s.message().substr(0, c.path.size() + 1), c.path + " ")
        << c.name << ": " << s.message();
  }
}

TEST(RawMessageTest, MalformedBytesAreRefusedWithoutAFieldName) {
  v1::GenerateRequest r;
  r.set_prompt("hello");
  std::string bytes = Bytes(r);
  for (const std::string& bad :
       {bytes.substr(0, bytes.size() - 2), std::string("\x1a\xff\xff\xff\xff\x0f", 6),
        std::string("\x0b", 1) /* a start-group tag with no end */}) {
    v1::GenerateRequest parsed;
    const absl::Status s = ParseMessageBytes(bad, &parsed);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("tandem.v1.GenerateRequest"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace tandem::rpc
