// KV connections over TLS (common/transport/kv_stream.h): a transfer between two holders of the
// cluster CA's certificates lands byte for byte; a plaintext sender, a sender with a certificate
// from another CA, a TLS sender to a plaintext receiver and a plaintext sender told a TLS address
// are all refused before any byte reaches a reservation. Certificates from scripts/make_certs.sh.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/kv_cache_storage.h"
#include "common/transport/kv_control.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

class KvTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/kv_tls_", ::getpid(), "/"));
    const std::string cmd = absl::StrCat(
        "bash ", TANDEM_MAKE_CERTS, " ", *dir_, "a node:IP:127.0.0.1 >/dev/null && CA_NAME=other ",
        "bash ", TANDEM_MAKE_CERTS, " ", *dir_, "b rogue:IP:127.0.0.1 >/dev/null");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static KvTls::Files Files(const std::string& ca_dir, const std::string& name) {
    return {*dir_ + ca_dir + "/" + name + ".pem", *dir_ + ca_dir + "/" + name + ".key",
            *dir_ + ca_dir + "/ca.pem"};
  }

  void SetUp() override {
    backend_ = CpuBackend::Create({}).value();
    g_ = {/*num_layers=*/2, /*num_blocks=*/64, /*block_size=*/4, /*num_kv_heads=*/2,
          /*head_dim=*/8};
    src_ = KvCacheStorage::Create(backend_.get(), g_).value();
    dst_ = KvCacheStorage::Create(backend_.get(), g_).value();
    std::mt19937 rng(7);
    const size_t bytes = static_cast<size_t>(g_.bytes_per_block()) * g_.num_blocks * g_.num_layers;
    for (void* p : {src_->k_data(), src_->v_data()}) {
      auto* b = static_cast<unsigned char*>(p);
      for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>(rng());
    }
    std::memset(dst_->k_data(), 0, bytes);
    std::memset(dst_->v_data(), 0, bytes);
    bytes_per_layer_ = static_cast<size_t>(g_.bytes_per_block()) * g_.num_blocks;
  }

  std::unique_ptr<KvControlReceiver> Receiver(std::shared_ptr<KvTls> tls) {
    KvControlReceiver::Options o{"127.0.0.1", 0, dst_.get(), {"m", g_}, absl::Seconds(2)};
    o.tls = std::move(tls);
    return KvControlReceiver::Create(o).value();
  }

  // Sends blocks {1, 2, 3} of every layer into blocks {10, 11, 12}.
  absl::Status Transfer(KvControlSender* sender, KvControlReceiver* receiver) {
    const std::string cap = NewKvCapability();
    if (absl::Status s = receiver->Expect("r", {10, 11, 12}, cap); !s.ok()) return s;
    if (absl::Status s = sender->Begin("r", 12, cap); !s.ok()) return s;
    for (int32_t l = 0; l < g_.num_layers; ++l) {
      if (absl::Status s = sender->SendLayer("r", l, {1, 2, 3}, src_.get()); !s.ok()) return s;
    }
    if (absl::Status s = sender->End("r", 42); !s.ok()) return s;
    absl::StatusOr<int32_t> first = receiver->Wait("r", absl::Seconds(2));
    if (!first.ok()) return first.status();
    EXPECT_EQ(*first, 42);
    return absl::OkStatus();
  }

  bool Landed(bool v) const {
    const auto* s = static_cast<const char*>(v ? src_->v_data() : src_->k_data());
    const auto* d = static_cast<const char*>(v ? dst_->v_data() : dst_->k_data());
    const size_t bb = static_cast<size_t>(g_.bytes_per_block());
    for (int32_t l = 0; l < g_.num_layers; ++l) {
      for (int i = 0; i < 3; ++i) {
        if (std::memcmp(s + l * bytes_per_layer_ + (1 + i) * bb,
                        d + l * bytes_per_layer_ + (10 + i) * bb, bb) != 0)
          return false;
      }
    }
    return true;
  }
  bool Untouched() const {
    for (const void* p : {dst_->k_data(), dst_->v_data()}) {
      const auto* b = static_cast<const unsigned char*>(p);
      for (size_t i = 0; i < bytes_per_layer_ * g_.num_layers; ++i) {
        if (b[i] != 0) return false;
      }
    }
    return true;
  }

  static std::string* dir_;
  std::unique_ptr<CpuBackend> backend_;
  KvCacheGeometry g_;
  std::unique_ptr<KvCacheStorage> src_, dst_;
  size_t bytes_per_layer_ = 0;
};

std::string* KvTlsTest::dir_ = nullptr;

TEST_F(KvTlsTest, ATransferBetweenClusterMembersLandsByteForByte) {
  std::shared_ptr<KvTls> node = KvTls::Create(Files("a", "node")).value();
  auto receiver = Receiver(node);
  const std::string address = absl::StrCat(kKvTlsScheme, "127.0.0.1:", receiver->port());
  auto sender = KvControlSender::Connect(address, {"m", g_}, absl::Seconds(2), nullptr, node.get());
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(Transfer(sender->get(), receiver.get()).ok());
  EXPECT_TRUE(Landed(false));
  EXPECT_TRUE(Landed(true));
  EXPECT_TRUE((*sender)->Connected());  // no session tickets or other bytes between transfers
}

TEST_F(KvTlsTest, StrangersAreRefusedBeforeAnyByteLands) {
  std::shared_ptr<KvTls> node = KvTls::Create(Files("a", "node")).value();
  std::shared_ptr<KvTls> rogue = KvTls::Create(Files("b", "rogue")).value();
  auto receiver = Receiver(node);
  const std::string plain = absl::StrCat("127.0.0.1:", receiver->port());
  const std::string tls = kKvTlsScheme + plain;
  // A sender with a certificate from another CA: the handshake fails.
  auto r1 = KvControlSender::Connect(tls, {"m", g_}, absl::Seconds(2), nullptr, rogue.get());
  EXPECT_FALSE(r1.ok());
  // One that trusts the cluster's CA (its certificate is public) but holds no certificate it
  // signed: the receiver refuses it.
  KvTls::Files f = Files("b", "rogue");
  f.ca_file = Files("a", "node").ca_file;
  std::shared_ptr<KvTls> knows_ca = KvTls::Create(f).value();
  auto r0 = KvControlSender::Connect(tls, {"m", g_}, absl::Seconds(2), nullptr, knows_ca.get());
  EXPECT_FALSE(r0.ok());
  // A plaintext sender that ignores the scheme: its handshake frame is no TLS hello, the receiver
  // closes the connection.
  auto r2 = KvControlSender::Connect(plain, {"m", g_}, absl::Seconds(2));
  EXPECT_FALSE(r2.ok());
  // A worker without KV TLS told a TLS address refuses at once, naming the flags.
  auto r3 = KvControlSender::Connect(tls, {"m", g_}, absl::Seconds(2));
  ASSERT_FALSE(r3.ok());
  EXPECT_THAT(r3.status().message(), HasSubstr("--tls-cert-file"));
  EXPECT_TRUE(Untouched());
  // A member still gets through afterwards.
  auto ok = KvControlSender::Connect(tls, {"m", g_}, absl::Seconds(2), nullptr, node.get());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(Transfer(ok->get(), receiver.get()).ok());
  EXPECT_TRUE(Landed(true));
}

TEST_F(KvTlsTest, ATlsSenderRefusesAPlaintextReceiver) {
  std::shared_ptr<KvTls> node = KvTls::Create(Files("a", "node")).value();
  auto receiver = Receiver(nullptr);
  auto s = KvControlSender::Connect(absl::StrCat("127.0.0.1:", receiver->port()), {"m", g_},
                                    absl::Seconds(2), nullptr, node.get());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("--kv-tls=false"));
}

TEST_F(KvTlsTest, MissingOrBrokenFilesAreRefusedWithTheirName) {
  KvTls::Files f = Files("a", "node");
  f.ca_file.clear();
  EXPECT_THAT(KvTls::Create(f).status().message(), HasSubstr("--tls-ca-file"));
  f = Files("a", "node");
  f.key_file = *dir_ + "b/rogue.key";  // not this certificate's key
  absl::StatusOr<std::shared_ptr<KvTls>> t = KvTls::Create(f);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("rogue.key"));
}

}  // namespace
}  // namespace tandem
