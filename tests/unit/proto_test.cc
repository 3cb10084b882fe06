// The public API's messages and service stubs compile and round-trip through the wire format.
#include <type_traits>

#include "gtest/gtest.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {
namespace {

TEST(ProtoTest, GenerateRequestRoundTrips) {
  v1::GenerateRequest req;
  req.set_request_id("r1");
  req.mutable_prompt_token_ids()->add_ids(5);
  req.mutable_prompt_token_ids()->add_ids(6);
  v1::SamplingParameters* s = req.mutable_sampling();
  s->set_temperature(0.5f);
  s->set_max_tokens(7);
  s->add_stop("END");
  auto* bias = s->add_logit_bias();
  bias->set_token_id(3);
  bias->set_bias(-2.5f);
  const std::string wire = req.SerializeAsString();
  v1::GenerateRequest back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.request_id(), "r1");
  ASSERT_TRUE(back.has_prompt_token_ids());
  EXPECT_EQ(back.prompt_token_ids().ids_size(), 2);
  EXPECT_TRUE(back.sampling().has_temperature());
  EXPECT_FALSE(back.sampling().has_top_p());  // unset optional fields stay distinguishable
  EXPECT_EQ(back.sampling().logit_bias(0).bias(), -2.5f);
  EXPECT_EQ(back.sampling().stop(0), "END");
}

TEST(ProtoTest, ServiceStubExists) {
  // The generated service names the five RPCs of the public API.
  const auto* service = v1::GenerateRequest::descriptor()->file()->FindServiceByName("Generation");
  static_assert(std::is_class_v<v1::Generation::Stub>, "gRPC stub generated");
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(service->method_count(), 5);
  EXPECT_NE(service->FindMethodByName("GenerateStream"), nullptr);
  EXPECT_TRUE(service->FindMethodByName("GenerateStream")->server_streaming());
}

}  // namespace
}  // namespace tandem
