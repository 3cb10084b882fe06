// End-to-end tests of the disaggregated service on loopback: real router, prefill and decode worker
// processes, driven through the public gRPC API. Each test starts its own cluster.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/rpc/convert.h"
#include "common/rpc/server.h"
#include "common/rpc/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health.grpc.pb.h"
#include "openssl/err.h"
#include "openssl/ssl.h"
#include "openssl/x509v3.h"
#include "reflection.grpc.pb.h"
#include "tests/e2e/local_cluster.h"
#include "tests/support/loopback.h"
#include "tests/unit/tiny_models.h"

namespace tandem::e2e {
namespace {

using ::testing::HasSubstr;

struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::vector<v1::PositionLogprobs> logprobs;
  std::string text;
  v1::GenerateResponse final;
  absl::Time start, end;
};

// Streams one request to its end. `context` (optional) lets the caller cancel it.
StreamResult Stream(v1::Generation::Stub* stub, const v1::GenerateRequest& req,
                    absl::Time deadline = absl::InfiniteFuture(),
                    grpc::ClientContext* context = nullptr) {
  StreamResult r;
  grpc::ClientContext own;
  grpc::ClientContext* ctx = context != nullptr ? context : &own;
  rpc::SetDeadline(ctx, deadline);
  r.start = absl::Now();
  auto reader = stub->GenerateStream(ctx, req);
  v1::GenerateStreamResponse m;
  while (reader->Read(&m)) {
    if (m.has_delta()) {
      r.ids.insert(r.ids.end(), m.delta().token_ids().begin(), m.delta().token_ids().end());
      r.logprobs.insert(r.logprobs.end(), m.delta().logprobs().begin(), m.delta().logprobs().end());
      r.text += m.delta().text();
    } else {
      r.final = m.final();
    }
  }
  r.status = reader->Finish();
  r.end = absl::Now();
  return r;
}

v1::GenerateRequest TokenRequest(const std::vector<int32_t>& prompt, int max_tokens,
                                 bool ignore_eos = true) {
  v1::GenerateRequest g;
  *g.mutable_prompt_token_ids()->mutable_ids() = {prompt.begin(), prompt.end()};
  g.mutable_sampling()->set_temperature(0);
  g.mutable_sampling()->set_max_tokens(max_tokens);
  g.mutable_sampling()->set_ignore_eos(ignore_eos);
  return g;
}

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int len, int vocab) {
  std::vector<int32_t> p(len);
  for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

// Runs `n` calls of `fn(i)` on `threads` threads.
void ParallelFor(int n, int threads, const std::function<void(int)>& fn) {
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i; (i = next++) < n;) fn(i);
    });
  }
  for (auto& t : pool) t.join();
}

class ServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { setenv("TANDEM_NUM_THREADS", "1", 1); }
  void SetUp() override { model_dir_ = testing_util::TinyModel("tiny-llama", 21); }

  std::unique_ptr<LocalCluster> StartCluster(ClusterOptions o) {
    o.model_dir = model_dir_;
    auto c = std::make_unique<LocalCluster>(o);
    absl::Status s = c->Start();
    EXPECT_TRUE(s.ok()) << s;
    return c;
  }
  std::string model_dir_;
  const int vocab_ = 512;
};

// ---------------------------------------------------------------- equivalence

struct Expected {
  std::vector<int32_t> ids;
  std::vector<LogprobEntry> logprobs;
};

// The in-process engine's outputs (same engine settings and device as the workers'). A request's
// outputs do not depend on the requests beside it (the equivalence the tests check), so each is
// computed once per test process, by model, KV cache dtype and request: the emulated GPU's tests
// send the same first requests in several cases.
std::vector<Expected> Reference(const std::string& model_dir,
                                const std::vector<v1::GenerateRequest>& reqs,
                                std::optional<DType> kv_dtype) {
  static std::map<std::string, Expected> computed;
  auto backend = E2eBackend().value();
  auto model = LlamaModel::Load(model_dir, backend.get()).value();
  const std::string prefix =
      absl::StrCat(model_dir, "|", std::string(DTypeName(model->KvCacheDType(kv_dtype))), "|");
  std::vector<Expected> out(reqs.size());
  std::vector<size_t> missing;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (auto it = computed.find(prefix + reqs[i].SerializeAsString()); it != computed.end()) {
      out[i] = it->second;
    } else {
      missing.push_back(i);
    }
  }
  if (missing.empty()) return out;
  EngineOptions o;
  o.kv_cache_dtype = kv_dtype;
  o.gpu_memory_utilization =
      0.15;  // on a GPU, beside the cluster's workers (as LocalCluster gives them)
  auto engine = Engine::Create(model.get(), o).value();
  for (size_t i : missing) {
    EngineRequest r;
    r.id = absl::StrCat(i);
    r.prompt_token_ids.assign(reqs[i].prompt_token_ids().ids().begin(),
                              reqs[i].prompt_token_ids().ids().end());
    r.params = rpc::FromProto(reqs[i].sampling());
    EXPECT_TRUE(engine->AddRequest(r).ok());
  }
  while (engine->HasWork()) {
    std::vector<RequestOutput> outs = engine->Step().value();
    for (const RequestOutput& o : outs) {
      Expected& e = out[std::stoi(o.id)];
      e.ids.insert(e.ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      e.logprobs.insert(e.logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
    }
  }
  for (size_t i : missing) computed[prefix + reqs[i].SerializeAsString()] = out[i];
  return out;
}

// kv_dtype: the workers' --kv-cache-dtype (unset: their default). `edit` (optional) changes each
// request before it is sent (the reference runs it without speculation). Returns what came back.
std::vector<StreamResult> ExpectEquivalent(
    v1::Generation::Stub* stub, const std::string& model_dir, int num_requests,
    std::optional<DType> kv_dtype = std::nullopt,
    const std::function<void(int, v1::GenerateRequest*)>& edit = nullptr) {
  std::mt19937 rng(77);
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < num_requests; ++i) {
    const int len =
        i % 10 == 0 ? 200 + static_cast<int>(rng() % 500) : 1 + static_cast<int>(rng() % 60);
    v1::GenerateRequest g =
        TokenRequest(RandomPrompt(rng, len, 512), 1 + static_cast<int>(rng() % 24), i % 3 != 0);
    g.set_request_id(absl::StrCat("eq-", i));
    g.mutable_sampling()->set_logprobs(3);
    if (i % 5 == 4) {  // seeded sampling must match too (the prefill worker draws the first token)
      g.mutable_sampling()->set_temperature(0.8f);
      g.mutable_sampling()->set_seed(1000 + i);
    }
    if (edit) edit(i, &g);
    reqs.push_back(g);
  }
  const std::vector<Expected> expected = Reference(model_dir, reqs, kv_dtype);
  std::vector<StreamResult> got(reqs.size());
  ParallelFor(num_requests, 12, [&](int i) { got[i] = Stream(stub, reqs[i]); });
  int mismatches = 0;
  for (int i = 0; i < num_requests; ++i) {
    EXPECT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    if (!got[i].status.ok()) return got;
    if (got[i].ids != expected[i].ids) {
      ++mismatches;
      ADD_FAILURE() << "request " << i << ": token ids differ";
      continue;
    }
    EXPECT_EQ(got[i].logprobs.size(), expected[i].logprobs.size()) << i;
    if (got[i].logprobs.size() != expected[i].logprobs.size()) return got;
    for (size_t k = 0; k < got[i].logprobs.size(); ++k) {
      const v1::PositionLogprobs& g = got[i].logprobs[k];
      const LogprobEntry& e = expected[i].logprobs[k];
      EXPECT_EQ(g.token_id(), e.token_id);
      EXPECT_EQ(g.logprob(), e.logprob) << "request " << i << " position " << k;
      EXPECT_EQ(g.rank(), e.rank);
      EXPECT_EQ(g.top_size(), static_cast<int>(e.top.size()));
      for (size_t t = 0; t < e.top.size() && t < static_cast<size_t>(g.top_size()); ++t) {
        EXPECT_EQ(g.top(t).token_id(), e.top[t].token_id);
        EXPECT_EQ(g.top(t).logprob(), e.top[t].logprob);
      }
    }
    EXPECT_EQ(got[i].final.usage().completion_tokens(), static_cast<int>(expected[i].ids.size()));
  }
  EXPECT_EQ(mismatches, 0);
  return got;
}

// Greedy requests speculating (k = 1..8 per request, or the workers' default) come back token for
// token, logprobs included, as the in-process engine gives them without speculation; their counts
// come with the final message. Returns the counts' sums: proposed, accepted.
std::pair<int64_t, int64_t> ExpectSpeculationEquivalent(
    v1::Generation::Stub* stub, const std::string& model_dir, int num_requests,
    v1::SpeculationMethod method = v1::SPECULATION_METHOD_NGRAM) {
  const std::vector<StreamResult> got = ExpectEquivalent(
      stub, model_dir, num_requests, std::nullopt, [method](int i, v1::GenerateRequest* g) {
        g->mutable_sampling()->set_temperature(0);  // sampled output differs in its draws
        g->mutable_sampling()->clear_seed();
        if (i % 3 != 2) {
          v1::Speculation* spec = g->mutable_sampling()->mutable_speculation();
          spec->set_method(method);
          spec->set_num_tokens(1 + i % 8);
        }
      });
  int64_t proposed = 0, accepted = 0;
  for (const StreamResult& r : got) {
    if (!r.final.has_speculation()) continue;
    EXPECT_LE(r.final.speculation().accepted(), r.final.speculation().proposed());
    proposed += r.final.speculation().proposed();
    accepted += r.final.speculation().accepted();
  }
  return {proposed, accepted};
}

void ExpectSomeKeptSomeRefused(std::pair<int64_t, int64_t> counts) {
  EXPECT_GT(counts.second, 0) << "the requests should have kept proposals";
  EXPECT_GT(counts.first, counts.second) << "and refused some";
}

TEST_F(ServiceTest, OnePrefillOneDecodeMatchesTheInProcessEngine) {
  auto c = StartCluster({.prefill = 1, .decode = 1});
  // TANDEM_E2E_EQUIVALENCE_REQUESTS caps the count (the CUDA emulator's run in ctest takes 40: four
  // long prompts among them, as in the 100).
  int n = 100;
  if (const char* cap = std::getenv("TANDEM_E2E_EQUIVALENCE_REQUESTS"); cap != nullptr)
    n = std::clamp(std::atoi(cap), 1, 100);
  ExpectEquivalent(c->generation(), model_dir_, n);
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
}

// A BF16 KV cache on both workers: the blocks cross the wire as BF16 and decode goes on from them
// exactly as the in-process engine with the same cache does.
TEST_F(ServiceTest, Bf16KvCacheDisaggregatedMatchesTheInProcessEngine) {
  auto c = StartCluster({.prefill = 1, .decode = 1, .worker_args = {"--kv-cache-dtype=bf16"}});
  ExpectEquivalent(c->generation(), model_dir_, 40, DType::kBF16);
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
}

// An int8 KV cache (the CPU's): blocks cross the wire with their scales, and decode goes on from
// them exactly as the in-process engine with the same cache does.
TEST_F(ServiceTest, Int8KvCacheDisaggregatedMatchesTheInProcessEngine) {
  auto c = StartCluster({.prefill = 1, .decode = 1, .worker_args = {"--kv-cache-dtype=int8"}});
  ExpectEquivalent(c->generation(), model_dir_, 40, DType::kI8);
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
}

TEST_F(ServiceTest, TwoPrefillTwoDecodeMatchesTheInProcessEngine) {
  auto c = StartCluster({.prefill = 2, .decode = 2});
  ExpectEquivalent(c->generation(), model_dir_, 100);
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
}

TEST_F(ServiceTest, StaticWorkerListsWorkWithoutRegistration) {
  auto c = StartCluster({.prefill = 1, .decode = 2, .static_workers = true});
  ExpectEquivalent(c->generation(), model_dir_, 20);
  // A static worker that dies is polled out of the live set like a silent registered one.
  const std::string victim = c->workers("decode")[0];
  c->process(victim)->Signal(SIGKILL);
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (absl::Now() < end && ::testing::Matches(::testing::Contains(victim))(c->Live())) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_THAT(c->Live(), ::testing::Not(::testing::Contains(victim)));
  EXPECT_TRUE(Stream(c->generation(), TokenRequest({1, 2, 3}, 4)).status.ok());
}

TEST_F(ServiceTest, CombinedRoleMatchesTheInProcessEngine) {
  auto c = StartCluster({.prefill = 0, .decode = 0, .combined = 1});
  ExpectEquivalent(c->generation(), model_dir_, 40);
}

TEST_F(ServiceTest, SpeculativeDecodingDisaggregatedAndCombinedMatchesTheInProcessEngine) {
  // The decode and combined workers also speculate by default (the third of the requests that do
  // not say).
  const std::vector<std::string> speculate = {
      "--speculative-method=ngram", "--num-speculative-tokens=3", "--speculative-adaptive=false"};
  {
    auto combined =
        StartCluster({.prefill = 0, .decode = 0, .combined = 1, .decode_args = speculate});
    ExpectSomeKeptSomeRefused(ExpectSpeculationEquivalent(combined->generation(), model_dir_, 30));
  }
  auto c = StartCluster({.prefill = 1, .decode = 1, .decode_args = speculate});
  ExpectSomeKeptSomeRefused(ExpectSpeculationEquivalent(c->generation(), model_dir_, 50));
  // A stop string inside an accepted run: the same text and tokens as without speculation.
  v1::GenerateRequest g;
  g.set_prompt("Once upon a time, once upon a time, once upon a time");
  g.mutable_sampling()->set_temperature(0);
  g.mutable_sampling()->set_max_tokens(60);
  g.mutable_sampling()->set_ignore_eos(true);
  g.mutable_sampling()->mutable_speculation()->set_method(v1::SPECULATION_METHOD_OFF);
  const StreamResult full = Stream(c->generation(), g);
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  ASSERT_GT(full.text.size(), 20u);
  for (size_t cut : {full.text.size() / 3, full.text.size() / 2, full.text.size() * 3 / 4}) {
    while (cut < full.text.size() && (static_cast<unsigned char>(full.text[cut]) & 0xC0) == 0x80)
      ++cut;
    // The stop is the text from `cut` up to where it first occurs there (whole characters), so it
    // ends the run at `cut`, past steps that speculated, whatever text this device generates.
    size_t end = cut;
    do {
      ++end;
      while (end < full.text.size() && (static_cast<unsigned char>(full.text[end]) & 0xC0) == 0x80)
        ++end;
    } while (end < full.text.size() && full.text.find(full.text.substr(cut, end - cut)) < cut);
    v1::GenerateRequest stop = g;
    stop.mutable_sampling()->add_stop(full.text.substr(cut, end - cut));
    const StreamResult plain = Stream(c->generation(), stop);
    stop.mutable_sampling()->mutable_speculation()->set_method(v1::SPECULATION_METHOD_NGRAM);
    stop.mutable_sampling()->mutable_speculation()->set_num_tokens(8);
    const StreamResult spec = Stream(c->generation(), stop);
    ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
    EXPECT_EQ(spec.final.finish_reason(), v1::FINISH_REASON_STOP);
    EXPECT_EQ(spec.text, plain.text);
    EXPECT_EQ(spec.ids, plain.ids);
    EXPECT_EQ(spec.final.usage().completion_tokens(), plain.final.usage().completion_tokens());
    EXPECT_TRUE(spec.final.has_speculation());
  }
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
}

// A decode worker with a draft model computes the draft's KV of each arriving prompt itself and
// speculates: the same greedy tokens. The draft is the target itself, so every proposal it makes
// that is verified is kept unless the draft's KV went wrong somewhere (a stop ends a run early).
TEST_F(ServiceTest, DraftModelSpeculationOnADecodeWorkerMatchesTheInProcessEngine) {
  auto c =
      StartCluster({.prefill = 1,
                    .decode = 1,
                    .decode_args = {"--speculative-model=" + model_dir_,
                                    "--num-speculative-tokens=3", "--speculative-adaptive=false"}});
  const auto [proposed, accepted] =
      ExpectSpeculationEquivalent(c->generation(), model_dir_, 40, v1::SPECULATION_METHOD_DRAFT);
  EXPECT_GT(proposed, 100);
  EXPECT_GE(accepted, proposed * 9 / 10);
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
}

TEST_F(ServiceTest, HostStagedKvTransferGivesTheSameOutputs) {
  // The path GPU workers take (layers copied out of and into device memory), forced on the CPU.
  auto c = StartCluster({.prefill = 1, .decode = 1, .worker_args = {"--kv-host-staging"}});
  ExpectEquivalent(c->generation(), model_dir_, 30);
}

TEST_F(ServiceTest, LayerwiseOverlapOffGivesTheSameOutputs) {
  auto c =
      StartCluster({.prefill = 1, .decode = 1, .prefill_args = {"--layerwise-transfer=false"}});
  ExpectEquivalent(c->generation(), model_dir_, 30);
}

// ---------------------------------------------------------------- text, stops, unary

TEST_F(ServiceTest, TextPromptStopStringsAndUnaryGenerate) {
  auto c = StartCluster({.prefill = 1, .decode = 1});
  v1::GenerateRequest g;
  g.set_prompt("Once upon a time");
  g.mutable_sampling()->set_temperature(0);
  g.mutable_sampling()->set_max_tokens(40);
  g.mutable_sampling()->set_ignore_eos(true);
  g.mutable_sampling()->set_prompt_logprobs(1);
  StreamResult full = Stream(c->generation(), g);
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  EXPECT_EQ(full.final.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(full.final.usage().completion_tokens(), 40);
  EXPECT_EQ(full.final.prompt_logprobs_size(), full.final.usage().prompt_tokens());
  EXPECT_GT(full.final.timings().time_to_first_token(), 0);
  EXPECT_GT(full.final.timings().prefill_compute(), 0);
  // The same through the unary call.
  v1::GenerateResponse unary;
  grpc::ClientContext ctx;
  ASSERT_TRUE(c->generation()->Generate(&ctx, g, &unary).ok());
  EXPECT_EQ(unary.text(), full.text);
  EXPECT_EQ(std::vector<int32_t>(unary.token_ids().begin(), unary.token_ids().end()), full.ids);
  // A stop string taken from the middle of that text ends generation there.
  ASSERT_GT(full.text.size(), 12u);
  size_t cut = full.text.size() / 2;
  while (cut < full.text.size() && (static_cast<unsigned char>(full.text[cut]) & 0xC0) == 0x80)
    ++cut;
  size_t end = cut + 1;
  while (end < full.text.size() && (static_cast<unsigned char>(full.text[end]) & 0xC0) == 0x80)
    ++end;
  const std::string stop = full.text.substr(cut, end - cut);
  g.mutable_sampling()->add_stop(stop);
  StreamResult stopped = Stream(c->generation(), g);
  ASSERT_TRUE(stopped.status.ok()) << stopped.status.error_message();
  EXPECT_EQ(stopped.final.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(stopped.text, full.text.substr(0, full.text.find(stop)));
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(1), &why)) << why;
}

TEST_F(ServiceTest, ASlowReaderDoesNotStallOtherStreams) {
  auto c = StartCluster({.prefill = 1, .decode = 1});
  std::atomic<bool> slow_done{false};
  absl::Time slow_end;
  int slow_tokens = 0;
  std::thread slow([&] {
    grpc::ClientContext ctx;
    auto reader = c->generation()->GenerateStream(&ctx, TokenRequest({5, 5, 5}, 200));
    v1::GenerateStreamResponse m;
    while (reader->Read(&m)) {
      slow_tokens += m.delta().token_ids_size();
      absl::SleepFor(absl::Milliseconds(10));  // a client that cannot keep up
    }
    EXPECT_TRUE(reader->Finish().ok());
    slow_end = absl::Now();
    slow_done = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  std::vector<StreamResult> fast(4);
  ParallelFor(4, 4, [&](int i) {
    fast[i] = Stream(c->generation(), TokenRequest({6, 7, i}, 300));
  });
  const absl::Time fast_end = absl::Now();
  for (const StreamResult& r : fast) {
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids.size(), 300u);
  }
  EXPECT_FALSE(slow_done.load()) << "the slow reader finished first: the test proves nothing";
  slow.join();
  EXPECT_EQ(slow_tokens, 200);
  EXPECT_LT(fast_end - start, (slow_end - start) / 2);
}

// The health status `address` reports for `service` ("" = the whole process).
grpc::health::v1::HealthCheckResponse::ServingStatus HealthOf(const std::string& address,
                                                              const std::string& service) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  if (!health->Check(&ctx, req, &resp).ok()) return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  return resp.status();
}

// One HTTP/1.1 request to 127.0.0.1:port; returns the status code (-1 when nothing answered).
int HttpStatus(int port, const std::string& method, const std::string& path,
               const std::string& authorization, const std::string& body = "") {
  const int fd = test_support::ConnectLoopback(port);
  if (fd < 0) return -1;
  std::string request = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                                     "Content-Type: application/json\r\nConnection: close\r\n");
  if (!authorization.empty()) absl::StrAppend(&request, "Authorization: ", authorization, "\r\n");
  absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n\r\n", body);
  (void)!::write(fd, request.data(), request.size());
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
  ::close(fd);
  int status = -1;
  if (response.rfind("HTTP/1.1 ", 0) == 0) status = std::atoi(response.c_str() + 9);
  return status;
}

// HTTPS to 127.0.0.1:`port`, the server's certificate verified against `ca_file` (for the IP
// 127.0.0.1): each of `requests` in turn on one connection, each answer read whole (Content-Length
// or chunked) before the next is sent. `close_after_first_event`: the first request's answer is
// left after its first chunk and the connection closed (a client gone mid-stream). Returns the
// answers, or why there were none (the handshake's OpenSSL reason).
absl::StatusOr<std::vector<std::string>> HttpsExchange(int port, const std::string& ca_file,
                                                       const std::vector<std::string>& requests,
                                                       bool close_after_first_event = false) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  SSL* ssl = SSL_new(ctx);
  auto cleanup = [&] {
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    ::close(fd);
  };
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    cleanup();
    return absl::UnavailableError("connect failed");
  }
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), "127.0.0.1");
  SSL_set_fd(ssl, fd);
  if (SSL_connect(ssl) != 1) {
    char why[256];
    ERR_error_string_n(ERR_get_error(), why, sizeof(why));
    cleanup();
    return absl::UnavailableError(absl::StrCat("handshake: ", why));
  }
  std::vector<std::string> answers;
  std::string pending;  // read past the last answer
  for (const std::string& request : requests) {
    SSL_write(ssl, request.data(), static_cast<int>(request.size()));
    std::string answer = std::move(pending);
    pending.clear();
    auto complete = [&]() -> size_t {  // the answer's length once whole, else 0
      const size_t head = answer.find("\r\n\r\n");
      if (head == std::string::npos) return 0;
      const std::string headers = absl::AsciiStrToLower(answer.substr(0, head));
      if (const size_t cl = headers.find("content-length: "); cl != std::string::npos) {
        const size_t n = head + 4 + std::strtoul(headers.c_str() + cl + 16, nullptr, 10);
        return answer.size() >= n ? n : 0;
      }
      if (close_after_first_event && answers.empty() &&
          answer.find("data: ", head) != std::string::npos)
        return answer.size();
      const size_t end = answer.find("\r\n0\r\n\r\n", head);
      return end == std::string::npos ? 0 : end + 7;
    };
    char buf[4096];
    size_t n = 0;
    while ((n = complete()) == 0) {
      const int got = SSL_read(ssl, buf, sizeof(buf));
      if (got <= 0) break;
      answer.append(buf, got);
    }
    if (n > 0) {
      pending = answer.substr(n);
      answer.resize(n);
    }
    answers.push_back(std::move(answer));
    if (close_after_first_event) break;
  }
  if (!close_after_first_event) SSL_shutdown(ssl);
  cleanup();
  return answers;
}

std::string HttpRequestText(const std::string& method, const std::string& path,
                            const std::string& body = "") {
  return absl::StrCat(method, " ", path,
                      " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: ",
                      body.size(), "\r\n\r\n", body);
}

// API keys on both front doors: no key, a wrong key and a key over its rate are refused (gRPC
// UNAUTHENTICATED / RESOURCE_EXHAUSTED, HTTP 401 / 429), a good key is served; health stays open.
TEST_F(ServiceTest, ApiKeysGuardBothFrontDoorsWithPerKeyRateLimits) {
  const std::string keys = absl::StrCat(::testing::TempDir(), "/api_keys_", ::getpid(), ".txt");
  std::ofstream(keys) << "sk-open-0123456789abcdef name=open\n"
                         "sk-tight-0123456789abcdef name=tight rpm=3\n";
  const int http_port = FreePort();
  auto c = StartCluster(
      {.prefill = 1,
       .decode = 1,
       .router_args = {"--api-key-file=" + keys, absl::StrCat("--http-port=", http_port)}});
  auto generate = [&](const std::string& key) {
    grpc::ClientContext ctx;
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
    rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(20));
    v1::GenerateResponse r;
    return c->generation()->Generate(&ctx, TokenRequest({1, 2, 3}, 2), &r);
  };
  EXPECT_EQ(generate("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(generate("sk-wrong-0123456789abcdef").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(generate("sk-open-0123456789abcdef").ok());
  {
    grpc::ClientContext ctx;  // every client-facing RPC, not only generation
    v1::ListModelsResponse models;
    EXPECT_EQ(c->generation()->ListModels(&ctx, v1::ListModelsRequest(), &models).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(generate("sk-tight-0123456789abcdef").ok()) << i;
  const grpc::Status over = generate("sk-tight-0123456789abcdef");
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("'tight' is over its limit of 3 requests a minute"));
  EXPECT_TRUE(generate("sk-open-0123456789abcdef").ok()) << "limits are per key";

  const std::string body = R"({"prompt": [1, 2, 3], "max_tokens": 2})";
  EXPECT_EQ(HttpStatus(http_port, "POST", "/v1/completions", "", body), 401);
  EXPECT_EQ(
      HttpStatus(http_port, "POST", "/v1/completions", "Bearer sk-nope-0123456789abcdef", body),
      401);
  EXPECT_EQ(HttpStatus(http_port, "GET", "/v1/models", ""), 401);
  EXPECT_EQ(
      HttpStatus(http_port, "POST", "/v1/completions", "Bearer sk-open-0123456789abcdef", body),
      200);
  EXPECT_EQ(
      HttpStatus(http_port, "POST", "/v1/completions", "Bearer sk-tight-0123456789abcdef", body),
      429);
  EXPECT_EQ(HttpStatus(http_port, "GET", "/health", ""), 200) << "health needs no key";
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
  std::filesystem::remove(keys);
}

// ---------------------------------------------------------------- transport security

// TLS on every gRPC hop (client→router one-way or mutual, router→worker and registration mutual):
// the outputs do not change, and every kind of stranger is refused. The router's certificate is
// re-read from disk while it runs.
TEST_F(ServiceTest, TlsOnEveryHopRefusesStrangersAndChangesNoOutput) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/tls_", ::getpid());
  const std::string a = dir + "/a/", b = dir + "/b/";
  ASSERT_EQ(std::system(absl::StrCat("bash ", TANDEM_MAKE_CERTS, " ", a,
                                     " node:IP:127.0.0.1 router:IP:127.0.0.1 >/dev/null && "
                                     "CA_NAME=other bash ",
                                     TANDEM_MAKE_CERTS, " ", b, " rogue:IP:127.0.0.1 >/dev/null")
                            .c_str()),
            0);
  auto flags = [&](const std::string& name) {
    return std::vector<std::string>{"--tls-cert-file=" + a + name + ".pem",
                                    "--tls-key-file=" + a + name + ".key",
                                    "--tls-ca-file=" + a + "ca.pem", "--tls-refresh-s=1"};
  };
  rpc::TlsOptions member;  // a certificate from the cluster's CA
  member.cert_file = a + "node.pem";
  member.key_file = a + "node.key";
  member.ca_file = a + "ca.pem";
  const int http_port = FreePort();
  std::vector<std::string> router_args = flags("router");
  router_args.push_back(absl::StrCat("--http-port=", http_port));
  auto c = StartCluster({.prefill = 1,
                         .decode = 1,
                         .router_args = router_args,
                         .worker_args = flags("node"),
                         .tls = member});
  ExpectEquivalent(c->generation(), model_dir_, 30);
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
  {  // The KV went over TLS too: the decode worker's receiver takes only TLS, and says so.
    grpc::ClientContext ctx;
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(c->registration()->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
    int decode = 0;
    for (const v1::WorkerInfo& w : workers.workers()) {
      if (w.worker().role() != v1::WORKER_ROLE_DECODE) continue;
      ++decode;
      EXPECT_THAT(w.worker().kv_address(), ::testing::StartsWith("tls://"));
    }
    EXPECT_EQ(decode, 1);
  }

  const std::string router = c->router_address();
  auto generate = [&](const rpc::TlsOptions& o) {
    auto stub = v1::Generation::NewStub(rpc::CreateTlsChannel(router, o));
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(5));
    v1::GenerateResponse r;
    return stub->Generate(&ctx, TokenRequest({1, 2, 3}, 2), &r);
  };
  rpc::TlsOptions anonymous;  // trusts the CA, shows no certificate
  anonymous.ca_file = a + "ca.pem";
  rpc::TlsOptions rogue;  // a certificate from another CA
  rogue.cert_file = b + "rogue.pem";
  rogue.key_file = b + "rogue.key";
  rogue.ca_file = a + "ca.pem";
  rpc::TlsOptions trusts_other;  // trusts only the other CA
  trusts_other.ca_file = b + "ca.pem";

  EXPECT_TRUE(generate(member).ok());
  EXPECT_TRUE(generate(anonymous).ok()) << "client certificates are optional on the router";
  EXPECT_EQ(generate(rpc::TlsOptions()).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a plaintext client";
  EXPECT_EQ(generate(rogue).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a client certificate from another CA";
  EXPECT_EQ(generate(trusts_other).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "the router's certificate must not verify against another CA";

  // A stranger registering as a worker without a certificate.
  {
    auto stub = v1::Registration::NewStub(rpc::CreateTlsChannel(router, anonymous));
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(5));
    v1::RegisterRequest req;
    req.mutable_worker()->set_address("127.0.0.1:1");
    req.mutable_worker()->set_role(v1::WORKER_ROLE_DECODE);
    v1::RegisterResponse resp;
    const grpc::Status s = stub->Register(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("certificate"));
    EXPECT_EQ(c->Live().size(), 2u);
  }
  // Workers take calls only from holders of the CA's certificates.
  const std::string worker = c->workers("decode").at(0);
  auto worker_status = [&](const rpc::TlsOptions& o) {
    auto stub = v1::WorkerStatus::NewStub(rpc::CreateTlsChannel(worker, o));
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Now() + absl::Seconds(5));
    v1::WorkerInfo info;
    return stub->GetStatus(&ctx, v1::GetStatusRequest(), &info);
  };
  EXPECT_TRUE(worker_status(member).ok());
  EXPECT_FALSE(worker_status(rpc::TlsOptions()).ok()) << "plaintext";
  EXPECT_FALSE(worker_status(anonymous).ok()) << "no client certificate";
  EXPECT_FALSE(worker_status(rogue).ok()) << "a certificate from another CA";

  // The HTTP API is HTTPS with the router's certificate: answers whole and streamed, two requests
  // on one kept-alive connection, and a client gone mid-stream (its request cancelled: the blocks
  // come back); plaintext HTTP and a client that does not trust the CA get nothing.
  {
    const std::string stream_body = R"({"prompt": [1, 2, 3], "max_tokens": 4, "stream": true})";
    absl::StatusOr<std::vector<std::string>> got =
        HttpsExchange(http_port, a + "ca.pem",
                      {HttpRequestText("GET", "/v1/models"),
                       HttpRequestText("POST", "/v1/completions", stream_body)});
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 2u);
    EXPECT_THAT((*got)[0], ::testing::StartsWith("HTTP/1.1 200"));
    EXPECT_THAT((*got)[0], HasSubstr("\"object\""));
    EXPECT_THAT((*got)[1], ::testing::StartsWith("HTTP/1.1 200"));
    EXPECT_THAT((*got)[1], HasSubstr("data: [DONE]"));
    const std::string long_body =
        R"({"prompt": [1, 2, 3], "max_tokens": 2000, "ignore_eos": true, "stream": true})";
    // The whole stream's time, then the same left after its first event: the request must end
    // (its blocks back) in a third of that — it is cancelled, not run to its end.
    absl::Time start = absl::Now();
    got = HttpsExchange(http_port, a + "ca.pem",
                        {HttpRequestText("POST", "/v1/completions", long_body)});
    const absl::Duration whole = absl::Now() - start;
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(got->at(0), HasSubstr("data: [DONE]"));
    got = HttpsExchange(http_port, a + "ca.pem",
                        {HttpRequestText("POST", "/v1/completions", long_body)},
                        /*close_after_first_event=*/true);
    start = absl::Now();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(got->at(0), HasSubstr("data: "));
    EXPECT_TRUE(c->WaitIdle(std::max(absl::Milliseconds(200), whole / 3), &why))
        << "an HTTPS client left mid-stream, and its request went on (the whole stream took "
        << whole << "): " << why;
    EXPECT_EQ(HttpStatus(http_port, "GET", "/v1/models", ""), -1) << "plaintext HTTP";
    got = HttpsExchange(http_port, b + "ca.pem", {HttpRequestText("GET", "/v1/models")});
    EXPECT_FALSE(got.ok()) << "the router's HTTPS certificate must not verify against another CA";
    if (!got.ok()) {
      EXPECT_THAT(got.status().message(), HasSubstr("certificate verify failed"));
    }
  }

  // Renewal: the router's files replaced by a certificate from the other CA are served to new
  // connections within the refresh interval (1 s here), without a restart — HTTPS too.
  for (const char* ext : {".key", ".pem"}) {
    std::filesystem::copy_file(b + "rogue" + ext, a + "router.tmp" + ext,
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(a + "router.tmp" + ext, a + "router" + ext);
  }
  bool renewed = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(15); !renewed && absl::Now() < end;) {
    renewed = generate(trusts_other).ok();
    if (!renewed) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(renewed) << "the renewed certificate was not picked up";
  renewed = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(15); !renewed && absl::Now() < end;) {
    renewed = HttpsExchange(http_port, b + "ca.pem", {HttpRequestText("GET", "/v1/models")}).ok();
    if (!renewed) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(renewed) << "HTTPS did not pick up the renewed certificate";
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST_F(ServiceTest, EveryProcessServesTheHealthService) {
  auto c = StartCluster({.prefill = 1, .decode = 1});
  std::vector<std::string> addresses = {c->router_address()};
  for (const char* role : {"prefill", "decode"}) {
    for (const std::string& a : c->workers(role)) addresses.push_back(a);
  }
  for (const std::string& a : addresses) {
    auto health = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(a, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok()) << a;
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << a;
    EXPECT_EQ(HealthOf(a, rpc::kLivenessService), grpc::health::v1::HealthCheckResponse::SERVING)
        << a;
  }
}

TEST_F(ServiceTest, EveryProcessServesReflectionSoGrpcurlWorks) {
  auto c = StartCluster({.prefill = 1, .decode = 1});
  const std::vector<std::pair<std::string, std::vector<std::string>>> expected = {
      {c->router_address(),
       {"tandem.v1.Generation", "tandem.v1.Registration", "grpc.health.v1.Health"}},
      {c->workers("prefill")[0], {"tandem.v1.Prefill", "tandem.v1.WorkerStatus"}},
      {c->workers("decode")[0], {"tandem.v1.Decode", "tandem.v1.WorkerStatus"}},
  };
  for (const auto& [address, services] : expected) {
    namespace refl = grpc::reflection::v1alpha;
    auto stub = refl::ServerReflection::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    auto stream = stub->ServerReflectionInfo(&ctx);
    refl::ServerReflectionRequest list;
    list.set_list_services("*");
    ASSERT_TRUE(stream->Write(list));
    refl::ServerReflectionResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    std::vector<std::string> names;
    for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
    for (const std::string& s : services) EXPECT_THAT(names, ::testing::Contains(s)) << address;
    // What grpcurl asks next: the file that defines a service, to build requests from.
    refl::ServerReflectionRequest file;
    file.set_file_containing_symbol(services[0]);
    ASSERT_TRUE(stream->Write(file));
    ASSERT_TRUE(stream->Read(&resp));
    EXPECT_GT(resp.file_descriptor_response().file_descriptor_proto_size(), 0) << address;
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
}

// ---------------------------------------------------------------- bad requests, overload

TEST_F(ServiceTest, BadRequestsAreRefusedWithAMessageAndTheNextOneSucceeds) {
  auto c = StartCluster({.prefill = 1, .decode = 1});
  const v1::GenerateRequest good = TokenRequest({1, 2, 3, 4}, 4);
  using Mutation = std::function<void(v1::GenerateRequest&)>;
  const std::vector<std::pair<std::string, Mutation>> cases = {
      {"no input", [](auto& g) { g.clear_input(); }},
      {"empty prompt", [](auto& g) { g.set_prompt(""); }},
      {"empty token ids", [](auto& g) { g.mutable_prompt_token_ids()->clear_ids(); }},
      {"negative token id", [](auto& g) { g.mutable_prompt_token_ids()->set_ids(0, -1); }},
      {"token id past the vocabulary",
       [](auto& g) { g.mutable_prompt_token_ids()->set_ids(0, 512); }},
      {"prompt over the context",
       [](auto& g) {
         for (int i = 0; i < 2100; ++i) g.mutable_prompt_token_ids()->add_ids(7);
       }},
      {"prompt + max_tokens over the context",
       [](auto& g) { g.mutable_sampling()->set_max_tokens(2046); }},
      {"unknown model", [](auto& g) { g.set_model("no-such-model"); }},
      {"negative temperature", [](auto& g) { g.mutable_sampling()->set_temperature(-1); }},
      {"NaN temperature", [](auto& g) { g.mutable_sampling()->set_temperature(std::nanf("")); }},
      {"top_p 0", [](auto& g) { g.mutable_sampling()->set_top_p(0); }},
      {"top_p above 1", [](auto& g) { g.mutable_sampling()->set_top_p(1.5f); }},
      {"top_k -2", [](auto& g) { g.mutable_sampling()->set_top_k(-2); }},
      {"min_p above 1", [](auto& g) { g.mutable_sampling()->set_min_p(1.5f); }},
      {"repetition_penalty 0", [](auto& g) { g.mutable_sampling()->set_repetition_penalty(0); }},
      {"presence_penalty 3", [](auto& g) { g.mutable_sampling()->set_presence_penalty(3); }},
      {"frequency_penalty -3", [](auto& g) { g.mutable_sampling()->set_frequency_penalty(-3); }},
      {"logit_bias id outside",
       [](auto& g) {
         auto* b = g.mutable_sampling()->add_logit_bias();
         b->set_token_id(9999);
         b->set_bias(1);
       }},
      {"logit_bias 200",
       [](auto& g) {
         auto* b = g.mutable_sampling()->add_logit_bias();
         b->set_token_id(3);
         b->set_bias(200);
       }},
      {"stop token id -5", [](auto& g) { g.mutable_sampling()->add_stop_token_ids(-5); }},
      {"max_tokens -1", [](auto& g) { g.mutable_sampling()->set_max_tokens(-1); }},
      {"min_tokens above max_tokens", [](auto& g) { g.mutable_sampling()->set_min_tokens(10); }},
      {"logprobs above the cap", [](auto& g) { g.mutable_sampling()->set_logprobs(21); }},
      {"prompt_logprobs -2", [](auto& g) { g.mutable_sampling()->set_prompt_logprobs(-2); }},
      {"empty stop string", [](auto& g) { g.mutable_sampling()->add_stop(""); }},
      {"17 stop strings",
       [](auto& g) {
         for (int i = 0; i < 17; ++i) g.mutable_sampling()->add_stop(absl::StrCat("s", i));
       }},
      {"control characters in the request id", [](auto& g) { g.set_request_id("a\nb"); }},
      // Strings protobuf itself refuses to parse: named, not UNIMPLEMENTED with no message.
      {"prompt not UTF-8", [](auto& g) { g.set_prompt("ab\xff"); }},
      {"prompt holding an encoded lone surrogate", [](auto& g) { g.set_prompt("a\xED\xA0\x80"); }},
      {"stop string not UTF-8", [](auto& g) { g.mutable_sampling()->add_stop("\xC0\x80"); }},
  };
  for (const auto& [name, mutate] : cases) {
    v1::GenerateRequest bad = good;
    mutate(bad);
    StreamResult r = Stream(c->generation(), bad);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << name << ": " << r.status.error_message();
    EXPECT_FALSE(r.status.error_message().empty()) << name;
    v1::GenerateResponse unary;
    grpc::ClientContext ctx;
    EXPECT_EQ(c->generation()->Generate(&ctx, bad, &unary).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT)
        << name;
    StreamResult ok = Stream(c->generation(), good);
    EXPECT_TRUE(ok.status.ok()) << "after " << name << ": " << ok.status.error_message();
    EXPECT_EQ(ok.ids.size(), 4u);
  }
  {
    v1::GenerateRequest bad = good;
    bad.set_prompt("a\xED\xA0\x80");
    StreamResult r = Stream(c->generation(), bad);
    EXPECT_EQ(r.status.error_message().rfind("prompt is not valid UTF-8", 0), 0u)
        << r.status.error_message();
    v1::TokenizeRequest t;
    t.set_text("\xff\xfe");
    v1::TokenizeResponse tr;
    grpc::ClientContext ctx;
    const grpc::Status ts = c->generation()->Tokenize(&ctx, t, &tr);
    EXPECT_EQ(ts.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(ts.error_message().rfind("text is not valid UTF-8", 0), 0u) << ts.error_message();
  }
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(1), &why)) << why;
}

TEST_F(ServiceTest, OverloadIsRefusedAtOnceAndAdmittedRequestsComplete) {
  auto c =
      StartCluster({.prefill = 1,
                    .decode = 1,
                    .router_args = {"--max-concurrent-requests=2", "--max-queued-requests=2"}});
  constexpr int kAdmitted = 4, kSent = 3 * kAdmitted;
  std::vector<StreamResult> results(kSent);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSent; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Stream(c->generation(), TokenRequest({5, 6, 7, i}, 600));
    });
  }
  for (auto& t : threads) t.join();
  int ok = 0, refused = 0;
  for (const StreamResult& r : results) {
    if (r.status.ok()) {
      ++ok;
      EXPECT_EQ(r.ids.size(), 600u);
    } else {
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << r.status.error_message();
      EXPECT_LT(r.end - r.start, absl::Milliseconds(50)) << "refusal took " << (r.end - r.start);
      ++refused;
    }
  }
  EXPECT_EQ(ok, kAdmitted);
  EXPECT_EQ(refused, kSent - kAdmitted);
}

TEST_F(ServiceTest, ATokenBudgetQueuesRequestsInsteadOfRefusingThem) {
  // Each request is 4 prompt + 300 output tokens: a budget of 700 runs two at a time.
  auto c = StartCluster({.prefill = 1, .decode = 1, .router_args = {"--max-inflight-tokens=700"}});
  constexpr int kSent = 5;
  std::vector<StreamResult> results(kSent);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSent; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Stream(c->generation(), TokenRequest({5, 6, 7, 100 + i}, 300));
    });
  }
  for (auto& t : threads) t.join();
  // When each ran on the router: from the end of its queueing to its end (a few ms trimmed off
  // both ends for the clocks of client and router).
  std::vector<std::pair<absl::Time, int>> edges;
  for (const StreamResult& r : results) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids.size(), 300u);
    const v1::Timings& t = r.final.timings();
    edges.push_back({r.start + absl::Seconds(t.router_queue()) + absl::Milliseconds(5), +1});
    edges.push_back({r.start + absl::Seconds(t.end_to_end()) - absl::Milliseconds(5), -1});
  }
  std::sort(edges.begin(), edges.end());
  int running = 0, most = 0;
  for (const auto& [at, step] : edges) most = std::max(most, running += step);
  EXPECT_EQ(most, 2) << "requests running at once under the token budget";
}

TEST_F(ServiceTest, KvPressureRefusesNewWorkInsteadOfFallingOver) {
  // 64 blocks of 16 tokens; above a quarter of them in use the decode worker reports itself full.
  // Heartbeats every 50 ms: on a GPU the long request holds the blocks for a few hundred ms only.
  auto c = StartCluster({.prefill = 1,
                         .decode = 1,
                         .worker_args = {"--kv-cache-memory=1M"},
                         .decode_args = {"--kv-high-water=0.25", "--heartbeat-interval-ms=50"}});
  std::mt19937 rng(12);
  StreamResult first;
  std::jthread t(
      [&] { first = Stream(c->generation(), TokenRequest(RandomPrompt(rng, 400, vocab_), 590)); });
  bool full = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(3); !full && absl::Now() < end;) {
    grpc::ClientContext ctx;
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(c->registration()->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
    for (const auto& w : workers.workers()) full |= w.load().kv_full();
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(full) << "the decode worker never reported itself full";
  const StreamResult refused = Stream(c->generation(), TokenRequest({1, 2, 3}, 10));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.status.error_message();
  EXPECT_THAT(refused.status.error_message(), HasSubstr("high-water"));
  EXPECT_LT(refused.end - refused.start, absl::Milliseconds(50));
  t.join();
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.ids.size(), 590u);
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
  absl::SleepFor(absl::Milliseconds(500));  // a heartbeat reports the pool free again
  EXPECT_TRUE(Stream(c->generation(), TokenRequest({1, 2, 3}, 10)).status.ok());
}

// ---------------------------------------------------------------- cancellation, deadlines

TEST_F(ServiceTest, CancellationAtEveryPhaseFreesTheBlocksOnBothWorkers) {
  // Cancelled mid-speculation too (the decode worker speculates).
  auto c = StartCluster({.prefill = 1,
                         .decode = 1,
                         .worker_args = {"--max-prefill-chunk=64"},
                         .decode_args = {"--speculative-method=ngram"}});
  std::mt19937 rng(5);
  const std::vector<int32_t> long_prompt = RandomPrompt(rng, 1500, vocab_);
  int cancelled = 0;
  // From before the request reaches a worker, through chunked prefill and the transfer, into
  // decode.
  for (int delay_ms : {0, 1, 2, 3, 5, 8, 12, 18, 25, 40, 60, 100, 200}) {
    std::vector<int32_t> prompt = long_prompt;
    prompt[0] = delay_ms;  // no prefix-cache shortcut between rounds
    grpc::ClientContext ctx;
    std::thread canceller([&] {
      absl::SleepFor(absl::Milliseconds(delay_ms));
      ctx.TryCancel();
    });
    StreamResult r =
        Stream(c->generation(), TokenRequest(prompt, 400), absl::InfiniteFuture(), &ctx);
    canceller.join();
    if (r.status.error_code() == grpc::StatusCode::CANCELLED) ++cancelled;
    std::string why;
    EXPECT_TRUE(c->WaitIdle(absl::Seconds(1), &why))
        << "cancelled after " << delay_ms << " ms: " << why;
  }
  EXPECT_GE(cancelled, 10);
  // The cluster still serves.
  EXPECT_TRUE(Stream(c->generation(), TokenRequest({1, 2, 3}, 5)).status.ok());
}

TEST_F(ServiceTest, DeadlineOnALongRequestEndsItInTimeAndOrphansNothing) {
  auto c = StartCluster({.prefill = 1, .decode = 1});
  std::mt19937 rng(6);
  // A first long prompt pays for what a cold worker does once (on a GPU: graph captures, cuBLAS
  // set-up), which would otherwise make the unbounded request look slower than the bounded one.
  ASSERT_TRUE(
      Stream(c->generation(), TokenRequest(RandomPrompt(rng, 1500, vocab_), 2)).status.ok());
  // The deadline is a fraction of what the same work takes here unbounded (a GPU finishes it far
  // sooner than a CPU): at most 1 s, at least 100 ms.
  const StreamResult full =
      Stream(c->generation(), TokenRequest(RandomPrompt(rng, 1500, vocab_), 540));
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  const absl::Duration deadline =
      std::clamp((full.end - full.start) / 3, absl::Milliseconds(100), absl::Seconds(1));
  const StreamResult r = Stream(c->generation(), TokenRequest(RandomPrompt(rng, 1500, vocab_), 540),
                                absl::Now() + deadline);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << r.status.error_message() << " (deadline " << deadline << ", the unbounded request took "
      << (full.end - full.start) << ")";
  EXPECT_LT(r.end - r.start, deadline + absl::Milliseconds(200));
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(1), &why)) << why;
}

// ---------------------------------------------------------------- worker faults

// A decode worker SIGKILLed mid-stream: the router resumes each of its streams on the other pair
// (request migration, on by default) from the prompt and the output already streamed. Every stream
// completes with the tokens of an undisturbed run, greedy (speculating, as the workers' default
// here) and seeded sampling alike, and none errors.
void ExpectKilledDecodeWorkerLosesNoStream(LocalCluster* c, const std::string& role) {
  const std::string victim = c->workers(role)[0];
  constexpr int kStreams = 10, kTokens = 800;
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < kStreams; ++i) {
    v1::GenerateRequest g = TokenRequest({9, 8, 7, i}, kTokens);
    if (i >= 8) {  // seeded sampling, one draw a token (not speculating), penalties and all
      v1::SamplingParameters* s = g.mutable_sampling();
      s->set_temperature(0.9f);
      s->set_top_p(0.95f);
      s->set_seed(40 + i);
      s->set_frequency_penalty(0.2f);
      s->mutable_speculation()->set_method(v1::SPECULATION_METHOD_OFF);
    }
    reqs.push_back(g);
  }
  // The undisturbed run, all streams together as below.
  std::vector<StreamResult> want(kStreams);
  ParallelFor(kStreams, kStreams, [&](int i) { want[i] = Stream(c->generation(), reqs[i]); });
  absl::Duration longest;
  for (const StreamResult& r : want) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.ids.size(), static_cast<size_t>(kTokens));
    longest = std::max(longest, r.end - r.start);
  }
  // The kill lands a quarter into what the streams take (at most 400 ms): mid-decode on a CPU or a
  // GPU alike.
  std::vector<StreamResult> got(kStreams);
  std::thread killer([&] {
    absl::SleepFor(std::min(absl::Milliseconds(400), longest / 4));
    c->process(victim)->Signal(SIGKILL);
  });
  ParallelFor(kStreams, kStreams, [&](int i) { got[i] = Stream(c->generation(), reqs[i]); });
  killer.join();
  int migrated = 0;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].ids, want[i].ids) << "stream " << i;
    EXPECT_EQ(got[i].text, want[i].text) << "stream " << i;
    EXPECT_EQ(got[i].final.usage().completion_tokens(), kTokens) << "stream " << i;
    EXPECT_EQ(got[i].final.finish_reason(), v1::FINISH_REASON_LENGTH);
    migrated += got[i].final.migrations() > 0 ? 1 : 0;
  }
  EXPECT_GT(migrated, 0) << "the kill should have caught streams mid-decode";
  EXPECT_LT(migrated, kStreams) << "the other decode worker should have had streams of its own";
  EXPECT_THAT(c->Live(), ::testing::Not(::testing::Contains(victim)));
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
}

TEST_F(ServiceTest, KilledDecodeWorkerLosesNoStream) {
  // The decode workers speculate: the survivor's blocks, rejected positions' included, all come
  // back (WaitIdle).
  auto c = StartCluster({.prefill = 2, .decode = 2, .decode_args = {"--speculative-method=ngram"}});
  ExpectKilledDecodeWorkerLosesNoStream(c.get(), "decode");
}

TEST_F(ServiceTest, KilledCombinedWorkerLosesNoStream) {
  auto c = StartCluster(
      {.prefill = 0, .decode = 0, .combined = 2, .decode_args = {"--speculative-method=ngram"}});
  ExpectKilledDecodeWorkerLosesNoStream(c.get(), "combined");
}

// With migration off (--max-migrations=0) the killed worker's streams fail fast with UNAVAILABLE,
// the others complete, and new requests go around it.
TEST_F(ServiceTest, KilledDecodeWorkerWithMigrationOffFailsOnlyItsStreams) {
  auto c = StartCluster({.prefill = 1, .decode = 2, .router_args = {"--max-migrations=0"}});
  const std::string victim = c->workers("decode")[0];
  const StreamResult alone = Stream(c->generation(), TokenRequest({9, 8, 7, 100}, 1500));
  ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
  constexpr int kStreams = 8;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Stream(c->generation(), TokenRequest({9, 8, 7, i}, 1500));
    });
  }
  absl::SleepFor(std::min(absl::Milliseconds(400), (alone.end - alone.start) / 4));
  const absl::Time killed = absl::Now();
  c->process(victim)->Signal(SIGKILL);
  for (auto& t : threads) t.join();
  int ok = 0, unavailable = 0;
  for (const StreamResult& r : results) {
    if (r.status.ok()) {
      ++ok;
      EXPECT_EQ(r.ids.size(), 1500u);
    } else {
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
      EXPECT_LT(r.end - killed, absl::Seconds(5)) << r.status.error_message();
      ++unavailable;
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(unavailable, 0);
  EXPECT_THAT(c->Live(), ::testing::Not(::testing::Contains(victim)));
  std::vector<StreamResult> after(8);
  ParallelFor(8, 8, [&](int i) { after[i] = Stream(c->generation(), TokenRequest({4, 4, i}, 8)); });
  for (const StreamResult& r : after) EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
}

TEST_F(ServiceTest, KilledPrefillWorkerIsRetriedElsewhere) {
  auto c = StartCluster({.prefill = 2, .decode = 1});
  c->process(c->workers("prefill")[0])->Signal(SIGKILL);
  // The router has not noticed yet: requests routed to the dead worker must be retried.
  std::mt19937 rng(8);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 16; ++i) prompts.push_back(RandomPrompt(rng, 70, vocab_));
  std::vector<StreamResult> results(16);
  ParallelFor(16, 16, [&](int i) {
    results[i] =
        Stream(c->generation(), TokenRequest(prompts[i], 8), absl::Now() + absl::Seconds(10));
  });
  for (const StreamResult& r : results) EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
}

// Whether process `pid` is stopped (state T in /proc/PID/stat).
bool Stopped(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');  // the state follows the parenthesised command name
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'T';
}

// A prefill worker that stops in the middle of a KV transfer (--fault-stop-after-kv-layer: layer 0
// sent, then SIGSTOP, its connections open) holds the decode worker's reservation only until the
// transfer timeout; killed there instead, its transfer fails at once. Either way only its request
// fails, the decode worker's blocks all come back, and it goes on serving (no thread of it hangs on
// the peer). Over TCP; over NCCL with TANDEM_E2E_KV_TRANSPORT=nccl (gpu_check.sh), where the hung
// case is a receive the link's deadline aborts and the dead one NCCL's remote error; over CUDA IPC
// (=cuda-ipc), where the dead one is the link's socket closing.
TEST_F(ServiceTest, APrefillWorkerHungOrKilledMidTransferFailsOnlyItsRequest) {
  constexpr int kTransferTimeoutS = 4;
  for (const bool kill : {false, true}) {
    SCOPED_TRACE(kill ? "killed mid-transfer" : "hung mid-transfer");
    auto c = StartCluster(
        {.prefill = 0,
         .decode = 1,
         .decode_args = {absl::StrCat("--kv-transfer-timeout-s=", kTransferTimeoutS)}});
    const std::string decode = c->workers("decode")[0];
    auto faulty = c->AddWorker("prefill", {"--fault-stop-after-kv-layer=0"});
    ASSERT_TRUE(faulty.ok()) << faulty.status();
    Subprocess* victim = c->process(*faulty);
    struct Reaper {  // a stopped process would not see the cluster's SIGTERM
      Subprocess* p;
      ~Reaper() {
        p->Signal(SIGKILL);
        (void)p->Wait(absl::Seconds(10));
      }
    } reaper{victim};
    std::mt19937 rng(kill ? 12 : 11);
    StreamResult hit;
    std::thread request([&] {
      hit = Stream(c->generation(), TokenRequest(RandomPrompt(rng, 64, vocab_), 8),
                   absl::Now() + absl::Seconds(60));
    });
    struct Joiner {
      std::thread& t;
      ~Joiner() {
        if (t.joinable()) t.join();  // (after a failed ASSERT too)
      }
    } joiner{request};
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (!Stopped(victim->pid()) && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_TRUE(Stopped(victim->pid())) << "the prefill worker never stopped mid-transfer:\n"
                                        << c->Log(*faulty);
    const absl::Time stopped = absl::Now();
    if (kill) victim->Signal(SIGKILL);
    // The decode worker's pool comes back whole: at once for a dead peer, at the transfer timeout
    // for a hung one.
    std::string why;
    bool idle = false;
    while (!idle && absl::Now() < stopped + absl::Seconds(kTransferTimeoutS + 3)) {
      auto info = c->Status(decode);
      if (info.ok()) {
        const v1::WorkerLoad& l = info->load();
        idle = l.free_blocks() == l.total_blocks() && l.running() == 0 && l.waiting() == 0 &&
               l.pending_transfers() == 0;
        why = absl::StrCat("free ", l.free_blocks(), "/", l.total_blocks(), " running ",
                           l.running(), " transfers ", l.pending_transfers());
      } else {
        why = std::string(info.status().message());
      }
      if (!idle) absl::SleepFor(absl::Milliseconds(20));
    }
    const absl::Duration freed_after = absl::Now() - stopped;
    EXPECT_TRUE(idle) << "the decode worker still holds the transfer's blocks: " << why;
    if (kill) {
      EXPECT_LT(freed_after, absl::Seconds(kTransferTimeoutS))
          << "a dead peer waited for the timeout";
    }
    // The request fails (or, once a healthy prefill worker is there, may be retried there); nothing
    // else does.
    auto healthy = c->AddWorker("prefill");
    ASSERT_TRUE(healthy.ok()) << healthy.status();
    request.join();
    if (!hit.status.ok()) {
      EXPECT_THAT(hit.status.error_code(), ::testing::AnyOf(grpc::StatusCode::UNAVAILABLE,
                                                            grpc::StatusCode::DEADLINE_EXCEEDED))
          << hit.status.error_message();
    }
    // The router stops routing to the stopped worker (missed heartbeats); then the decode worker
    // serves requests from the healthy one.
    for (const absl::Time end = absl::Now() + absl::Seconds(15);
         absl::c_linear_search(c->Live(), *faulty) && absl::Now() < end;) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_THAT(c->Live(), ::testing::Not(::testing::Contains(*faulty)));
    std::vector<StreamResult> after(4);
    std::vector<std::vector<int32_t>> prompts;  // drawn here: the generator is not thread-safe
    for (int i = 0; i < 4; ++i) prompts.push_back(RandomPrompt(rng, 40 + i, vocab_));
    ParallelFor(4, 4, [&](int i) {
      after[i] =
          Stream(c->generation(), TokenRequest(prompts[i], 8), absl::Now() + absl::Seconds(30));
    });
    for (const StreamResult& r : after) {
      EXPECT_TRUE(r.status.ok()) << r.status.error_message();
      EXPECT_EQ(r.ids.size(), 8u);
    }
    std::printf("%s: the decode worker's blocks were back %s after the stop; the request %s\n",
                kill ? "killed" : "hung", absl::FormatDuration(freed_after).c_str(),
                hit.status.ok() ? "was retried and completed" : hit.status.error_message().c_str());
  }
}

// A KV connection that brings nothing for --kv-idle-connection-s, with no transfer of its own
// waiting, is closed by the decode worker (over NCCL, with its communicator); the prefill worker
// notices before its next transfer and opens another, so no request fails for it.
TEST_F(ServiceTest, AnIdleKvConnectionIsClosedAndTheNextTransferOpensAnother) {
  auto c = StartCluster({.prefill = 1, .decode = 1, .decode_args = {"--kv-idle-connection-s=1"}});
  const std::string decode = c->workers("decode")[0];
  std::mt19937 rng(21);
  const v1::GenerateRequest req = TokenRequest(RandomPrompt(rng, 48, vocab_), 8);
  auto closes = [&] {
    const std::string log = c->Log(decode);
    int n = 0;
    for (size_t at = log.find("closing KV connection"); at != std::string::npos;
         at = log.find("closing KV connection", at + 1)) {
      ++n;
    }
    return n;
  };
  auto closed = [&](int n) {  // waits for the n-th close
    const absl::Time end = absl::Now() + absl::Seconds(15);
    while (closes() < n && absl::Now() < end) absl::SleepFor(absl::Milliseconds(50));
    return closes() == n;
  };
  const StreamResult first = Stream(c->generation(), req, absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_EQ(first.ids.size(), 8u);
  ASSERT_TRUE(closed(1)) << "the idle connection was kept:\n" << c->Log(decode);
  for (int round = 1; round <= 2; ++round) {
    const StreamResult again = Stream(c->generation(), req, absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(again.status.ok()) << "round " << round << ": " << again.status.error_message();
    EXPECT_EQ(again.ids, first.ids) << "round " << round;
    // It came over a new connection, which is closed in its turn.
    EXPECT_TRUE(closed(round + 1)) << "round " << round << ":\n" << c->Log(decode);
  }
  std::string why;
  EXPECT_TRUE(c->WaitIdle(absl::Seconds(2), &why)) << why;
}

// A hung worker (SIGSTOP: its sockets stay open) is detected by missed heartbeats, its calls are
// cancelled and retried elsewhere, and no request outlives its deadline.
void HungWorkerTest(LocalCluster* c, const std::string& victim) {
  c->process(victim)->Signal(SIGSTOP);
  std::mt19937 rng(3);
  auto batch = [&](int n) {
    std::vector<StreamResult> results(n);
    std::vector<absl::Time> deadlines(n);
    std::vector<std::vector<int32_t>> prompts;  // drawn here: the generator is not thread-safe
    for (int i = 0; i < n; ++i) prompts.push_back(RandomPrompt(rng, 40 + i, 512));
    ParallelFor(n, n, [&](int i) {
      deadlines[i] = absl::Now() + absl::Seconds(8);
      results[i] = Stream(c->generation(), TokenRequest(prompts[i], 8), deadlines[i]);
    });
    for (int i = 0; i < n; ++i) EXPECT_LT(results[i].end, deadlines[i] + absl::Milliseconds(200));
    return results;
  };
  for (const StreamResult& r : batch(8)) {
    EXPECT_TRUE(r.status.ok() || r.status.error_code() == grpc::StatusCode::UNAVAILABLE)
        << r.status.error_message();
  }
  EXPECT_THAT(c->Live(), ::testing::Not(::testing::Contains(victim)));
  for (const StreamResult& r : batch(8)) EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  c->process(victim)->Signal(SIGCONT);
}

// Traffic as liveness: a worker whose heartbeats do not reach the router in time (here it sends one
// a minute; on a router too busy to take them, they arrive late) stays in service while it answers
// calls, and is dropped as before once it is silent in both.
TEST_F(ServiceTest, AWorkerAnsweringCallsStaysLiveWithoutHeartbeats) {
  auto c = StartCluster({.prefill = 1,
                         .decode = 1,
                         .router_args = {"--heartbeat-timeout-s=1"},
                         .prefill_args = {"--heartbeat-interval-ms=60000"}});
  const std::string prefill = c->workers("prefill")[0];
  std::mt19937 rng(5);
  int served = 0;
  for (const absl::Time end = absl::Now() + absl::Seconds(3); absl::Now() < end; ++served) {
    const StreamResult r = Stream(c->generation(), TokenRequest(RandomPrompt(rng, 24, vocab_), 4));
    ASSERT_TRUE(r.status.ok()) << "request " << served << ": " << r.status.error_message();
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_GE(served, 5);
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_THAT(c->Live(), ::testing::Not(::testing::Contains(prefill)))
      << "silent and idle for 1.5 s against a 1 s timeout";
}

TEST_F(ServiceTest, HungDecodeWorkerIsRoutedAround) {
  auto c = StartCluster({.prefill = 1, .decode = 2});
  HungWorkerTest(c.get(), c->workers("decode")[0]);
}

TEST_F(ServiceTest, HungPrefillWorkerIsRoutedAround) {
  auto c = StartCluster({.prefill = 2, .decode = 1});
  HungWorkerTest(c.get(), c->workers("prefill")[0]);
}

// A worker that stalls briefly (well within the heartbeat timeout) under frequent keepalive pings
// delays its requests but fails none.
TEST_F(ServiceTest, ABrieflyPausedPrefillDelaysButDoesNotFailRequests) {
  auto c = StartCluster(
      {.prefill = 1,
       .decode = 1,
       .router_args = {"--worker-keepalive-ms=100", "--worker-keepalive-timeout-ms=2500"}});
  const std::string prefill = c->workers("prefill")[0];
  c->process(prefill)->Signal(SIGSTOP);
  std::thread resume([&] {
    absl::SleepFor(absl::Milliseconds(1500));  // well within the 3 s heartbeat timeout
    c->process(prefill)->Signal(SIGCONT);
  });
  const StreamResult r = Stream(c->generation(), TokenRequest({1, 2, 3, 4, 5}, 8));
  resume.join();
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_GT(r.end - r.start, absl::Milliseconds(1000));
  EXPECT_EQ(r.ids.size(), 8u);
}

TEST_F(ServiceTest, SigtermDrainsInFlightStreams) {
  auto c = StartCluster({.prefill = 1, .decode = 2});
  const std::string victim = c->workers("decode")[0];
  std::vector<StreamResult> results(6);
  std::vector<std::thread> threads;
  // Long enough (near tiny-llama's 2,048 positions) that the victim is still draining when it is
  // probed: 800 tokens took under 0.4 s once the CPU kernels were tuned.
  constexpr int kTokens = 2000;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Stream(c->generation(), TokenRequest({3, 1, 4, i}, kTokens));
    });
  }
  absl::SleepFor(absl::Milliseconds(150));
  c->process(victim)->Signal(SIGTERM);
  // Draining: not ready (no new work), still alive (a liveness probe must not kill it).
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(HealthOf(victim, ""), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(HealthOf(victim, rpc::kLivenessService),
            grpc::health::v1::HealthCheckResponse::SERVING);
  for (auto& t : threads) t.join();
  for (const StreamResult& r : results) {
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids.size(), static_cast<size_t>(kTokens));
  }
  auto status = c->process(victim)->Wait(absl::Seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << c->Log(victim);
  EXPECT_THAT(c->Log(victim), HasSubstr("draining"));
  EXPECT_TRUE(Stream(c->generation(), TokenRequest({2, 7}, 8)).status.ok());
}

}  // namespace
}  // namespace tandem::e2e
