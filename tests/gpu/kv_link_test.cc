// A GPU KV data path (KvLink) between two processes on one GPU, as a prefill and a decode worker
// use it: --link=nccl (NCCL, each process with its own NCCL_HOSTID) or --link=cuda-ipc (the
// receiver maps the sender's staging). KvControlReceiver with the link factory here,
// KvControlSender in a child process (this binary run with --sender). Checks every moved value
// exactly (more blocks than one chunk holds, shuffled on both ends), that a cancelled transfer's
// layers are drained without desynchronising the pair, that a cancel mid-transfer keeps what landed
// before it and nothing after, that a killed sender fails only its transfer within the I/O timeout,
// that a receive from a peer that joined but never sends (alive: no error to see) ends at its
// deadline with the link aborted and holds up no other work of the device meanwhile, that a join
// nobody answers times out, and that rendezvous given up leave no threads or descriptors. Exit code
// 77 (ctest: skipped, label "gpu") without a device.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/backend/create_backend.h"
#include "common/backend/kv_cache_storage.h"
#include "common/base/subprocess.h"
#include "common/transport/kv_control.h"
#include "common/transport/kv_data_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// The link under test: "nccl" or "cuda-ipc" (--link; the sender is told the same).
std::string link_kind = "nccl";

// 700 blocks of 16 tokens × 2 heads × 64: a 600-block layer moves in three chunks (at most 256
// blocks each, on both links).
const KvCacheGeometry kGeometry = {/*num_layers=*/3, /*num_blocks=*/700, /*block_size=*/16,
                                   /*num_kv_heads=*/2,
                                   /*head_dim=*/64};
constexpr int32_t kReserved = 600;

// The sender's cache content, known to both processes: element i of block b of layer l of K (kv 0)
// or V.
float Value(int kv, int64_t layer, int64_t block, int64_t i) {
  uint32_t h = static_cast<uint32_t>(((kv * 7 + layer) * 100003 + block) * 1000003 + i);
  h ^= h >> 16;
  h *= 0x7feb352d;
  h ^= h >> 15;
  return static_cast<float>(h % 20001) / 10000.f - 1.f;
}

std::vector<int32_t> Shuffled(int32_t n, int32_t take, uint32_t seed) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  v.resize(take);
  return v;
}

struct Device {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KvCacheStorage> storage;
  std::unique_ptr<KvLinkFactory> links;
};

absl::StatusOr<Device> MakeDevice(bool fill) {
  Device d;
  auto backend = CreateBackend({.device = "cuda"});
  if (!backend.ok()) return backend.status();
  d.backend = *std::move(backend);
  auto storage = KvCacheStorage::Create(d.backend.get(), kGeometry);
  if (!storage.ok()) return storage.status();
  d.storage = *std::move(storage);
  const int64_t e = kGeometry.elements_per_block();
  std::vector<int32_t> all(kGeometry.num_blocks);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> host(all.size() * e);
  for (int kv = 0; kv < 2; ++kv) {
    for (int64_t l = 0; l < kGeometry.num_layers; ++l) {
      for (int64_t b = 0; b < kGeometry.num_blocks; ++b) {
        for (int64_t i = 0; i < e; ++i) host[b * e + i] = fill ? Value(kv, l, b, i) : 0.f;
      }
      d.storage->WriteBlocks(kv == 1, l, all, host.data());
    }
  }
  auto links = CreateKvLinkFactory(link_kind, d.storage.get());
  if (!links.ok()) return links.status();
  d.links = *std::move(links);
  return d;
}

const KvEndpointInfo kInfo = {"kv-link-test-model", kGeometry};

// --------------------------------------------------------------- the sender process

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "sender: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

absl::Status SendAll(KvControlSender* sender, KvCacheStorage* storage, const std::string& id,
                     const std::vector<int32_t>& blocks, int32_t token) {
  if (absl::Status s =
          sender->Begin(id, static_cast<int64_t>(blocks.size()) * kGeometry.block_size, "");
      !s.ok())
    return s;
  for (int32_t l = 0; l < kGeometry.num_layers; ++l) {
    if (absl::Status s = sender->SendLayer(id, l, blocks, storage); !s.ok()) return s;
  }
  return sender->End(id, token);
}

bool WaitForFile(const std::string& path, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (::access(path.c_str(), F_OK) != 0) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

void Touch(const std::string& path) {
  if (std::FILE* f = std::fopen(path.c_str(), "w")) std::fclose(f);
}

// mode "transfer": r1 (600 blocks), r2 (cancelled by the receiver beforehand), r3. mode "pause":
// layer 0 of r1, then `dir`/layer0, then waits for `dir`/go (or to be killed), then the rest of r1,
// whose End the receiver must refuse (it cancelled r1 meanwhile). mode "silent": joins the link
// whose rendezvous the receiver wrote to `dir`/rendezvous as rank 0, writes `dir`/joined, sends
// nothing, and exits once `dir`/go appears.
int RunSender(const std::string& mode, int port, const std::string& dir) {
  ::setenv("NCCL_HOSTID", "tandem-nccl-link-test-sender", 1);  // before any NCCL call
  auto device = MakeDevice(/*fill=*/true);
  if (!device.ok()) return Fail("device", device.status());
  if (mode == "silent") {
    if (!WaitForFile(dir + "/rendezvous", absl::Seconds(60)))
      return Fail("rendezvous", absl::DeadlineExceededError("none"));
    std::ifstream in(dir + "/rendezvous", std::ios::binary);
    const std::string rendezvous((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
    auto link = device->links->Join(rendezvous, 0, absl::Seconds(30));
    if (!link.ok()) return Fail("join", link.status());
    Touch(dir + "/joined");
    if (!WaitForFile(dir + "/go", absl::Seconds(120)))
      return Fail("go", absl::DeadlineExceededError("no go"));
    return 0;
  }
  const absl::StatusOr<DeviceMemory> memory_before = device->backend->Memory();
  if (!memory_before.ok()) return Fail("memory", memory_before.status());
  auto sender = KvControlSender::Connect(absl::StrCat("127.0.0.1:", port), kInfo, absl::Seconds(20),
                                         device->links.get());
  if (!sender.ok()) return Fail("connect", sender.status());
  const std::vector<int32_t> src = Shuffled(kGeometry.num_blocks, kReserved, 1);
  if (mode == "pause") {
    if (absl::Status s = (*sender)->Begin("r1", 64, ""); !s.ok()) return Fail("begin", s);
    if (absl::Status s = (*sender)->SendLayer("r1", 0, src, device->storage.get()); !s.ok())
      return Fail("layer", s);
    Touch(dir + "/layer0");
    if (!WaitForFile(dir + "/go", absl::Seconds(120)))
      return Fail("go", absl::DeadlineExceededError("no go"));
    for (int32_t l = 1; l < kGeometry.num_layers; ++l) {
      if (absl::Status s = (*sender)->SendLayer("r1", l, src, device->storage.get()); !s.ok())
        return Fail("layer", s);
    }
    if (absl::Status s = (*sender)->End("r1", 11);
        s.ok() || s.message().find("no reservation") == std::string::npos) {
      return Fail("r1 should have been refused after the cancel", s);
    }
    return 0;
  }
  if (absl::Status s = SendAll(sender->get(), device->storage.get(), "r1", src, 11); !s.ok())
    return Fail("r1", s);
  // r2 was cancelled by the receiver: it drains the layers and refuses the end.
  if (absl::Status s = SendAll(sender->get(), device->storage.get(), "r2",
                               Shuffled(kGeometry.num_blocks, 40, 2), 12);
      s.ok() || s.message().find("no reservation") == std::string::npos) {
    return Fail("r2 should have been refused for want of a reservation", s);
  }
  if (absl::Status s = SendAll(sender->get(), device->storage.get(), "r3", {5, 6, 7}, 13); !s.ok())
    return Fail("r3", s);
  if (link_kind == "cuda-ipc") {
    // The staging the receiver mapped (4 MiB here) is freed once the receiver has closed its end,
    // which it does when the control connection closes: promptly, not after the sender's release
    // wait (2 s).
    const absl::Time t0 = absl::Now();
    sender->reset();
    const absl::Duration took = absl::Now() - t0;
    const absl::StatusOr<DeviceMemory> after = device->backend->Memory();
    if (!after.ok()) return Fail("memory", after.status());
    const int64_t kept = memory_before->free_bytes - after->free_bytes;
    std::fprintf(stderr, "sender: closing the link took %s; %lld bytes of device memory not back\n",
                 absl::FormatDuration(took).c_str(), static_cast<long long>(kept));
    if (took > absl::Milliseconds(1500))
      return Fail("teardown", absl::DeadlineExceededError("waited for the release"));
    if (kept > (int64_t{1} << 20))
      return Fail("teardown", absl::InternalError("the staging was not freed"));
  }
  return 0;
}

// --------------------------------------------------------------- the receiver (tests)

class KvLinkTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto d = MakeDevice(/*fill=*/false);
    ASSERT_TRUE(d.ok()) << d.status();
    device_ = new Device(*std::move(d));
  }
  static void TearDownTestSuite() { delete device_; }

  std::unique_ptr<KvControlReceiver> Receiver(absl::Duration io_timeout) {
    KvControlReceiver::Options o;
    o.storage = device_->storage.get();
    o.info = kInfo;
    o.io_timeout = io_timeout;
    o.link_factories = {device_->links.get()};
    return KvControlReceiver::Create(o).value();
  }
  void SetUp() override {
    // Every block zero again; a directory for the sender's markers.
    const int64_t e = kGeometry.elements_per_block();
    std::vector<int32_t> all(kGeometry.num_blocks);
    std::iota(all.begin(), all.end(), 0);
    std::vector<float> zeros(all.size() * e, 0.f);
    for (int64_t l = 0; l < kGeometry.num_layers; ++l) {
      device_->storage->WriteBlocks(false, l, all, zeros.data());
      device_->storage->WriteBlocks(true, l, all, zeros.data());
    }
    dir_ = absl::StrCat(::testing::TempDir(), "/kv_link_test_", ::getpid(), "_", ++runs_);
    std::filesystem::create_directories(dir_);
  }
  Subprocess SpawnSender(const std::string& mode, int port) {
    return Subprocess::Spawn({ExecutableDir() + "/kv_link_test", "--sender", mode,
                              absl::StrCat(port), dir_, "--link=" + link_kind},
                             "")
        .value();
  }
  // Block `dst` of layers [first, last) (default: every layer) holds the sender's block `src`, K
  // and V.
  static bool Holds(int32_t dst, int32_t src, int64_t first = 0,
                    int64_t last = kGeometry.num_layers) {
    const int64_t e = kGeometry.elements_per_block();
    std::vector<float> host(e);
    for (int kv = 0; kv < 2; ++kv) {
      for (int64_t l = first; l < last; ++l) {
        device_->storage->ReadBlocks(kv == 1, l, {dst}, host.data());
        for (int64_t i = 0; i < e; ++i) {
          if (host[i] != Value(kv, l, src, i)) return false;
        }
      }
    }
    return true;
  }
  static bool IsZero(int32_t dst, int64_t first = 0, int64_t last = kGeometry.num_layers) {
    const int64_t e = kGeometry.elements_per_block();
    std::vector<float> host(e);
    for (int kv = 0; kv < 2; ++kv) {
      for (int64_t l = first; l < last; ++l) {
        device_->storage->ReadBlocks(kv == 1, l, {dst}, host.data());
        if (std::any_of(host.begin(), host.end(), [](float x) { return x != 0.f; })) return false;
      }
    }
    return true;
  }
  static Device* device_;
  static int runs_;
  std::string dir_;
};
Device* KvLinkTest::device_ = nullptr;
int KvLinkTest::runs_ = 0;

TEST_F(KvLinkTest, LayersArriveExactlyInShuffledBlocksAndCancelledOnesAreDrained) {
  auto receiver = Receiver(absl::Seconds(20));
  const std::vector<int32_t> src = Shuffled(kGeometry.num_blocks, kReserved, 1);
  const std::vector<int32_t> dst = Shuffled(kGeometry.num_blocks, kReserved, 3);
  ASSERT_TRUE(receiver->Expect("r1", dst, "").ok());
  std::vector<int32_t> spare;  // blocks no transfer may touch
  for (int32_t b = 0; b < kGeometry.num_blocks; ++b) {
    if (std::find(dst.begin(), dst.end(), b) == dst.end()) spare.push_back(b);
  }
  ASSERT_GE(spare.size(), 10u);
  ASSERT_TRUE(receiver->Expect("r2", {spare[0]}, "").ok());
  receiver->Cancel("r2");
  ASSERT_TRUE(receiver->Expect("r3", {spare[1], spare[2], spare[3]}, "").ok());
  Subprocess child = SpawnSender("transfer", receiver->port());
  auto t1 = receiver->Wait("r1", absl::Seconds(60));
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_EQ(*t1, 11);
  auto t3 = receiver->Wait("r3", absl::Seconds(60));
  ASSERT_TRUE(t3.ok()) << t3.status();
  EXPECT_EQ(*t3, 13);
  auto status = child.Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "the sender failed: see its stderr above";
  for (size_t i = 0; i < src.size(); ++i) ASSERT_TRUE(Holds(dst[i], src[i])) << "block " << dst[i];
  EXPECT_TRUE(Holds(spare[1], 5) && Holds(spare[2], 6) && Holds(spare[3], 7));
  EXPECT_TRUE(IsZero(spare[0]));  // the cancelled transfer's block
  for (size_t i = 4; i < spare.size(); ++i) EXPECT_TRUE(IsZero(spare[i])) << spare[i];
}

TEST_F(KvLinkTest, ACancelMidTransferKeepsWhatLandedBeforeItAndNothingAfter) {
  auto receiver = Receiver(absl::Seconds(20));
  const std::vector<int32_t> src = Shuffled(kGeometry.num_blocks, kReserved, 1);
  const std::vector<int32_t> dst = Shuffled(kGeometry.num_blocks, kReserved, 5);
  ASSERT_TRUE(receiver->Expect("r1", dst, "").ok());
  Subprocess child = SpawnSender("pause", receiver->port());
  ASSERT_TRUE(WaitForFile(dir_ + "/layer0", absl::Seconds(60)));
  // The sender's marker means layer 0 was sent; the receiver lands it just after its receive
  // completes (a cancel before that drops it, by design). Wait until it is here.
  const auto layer0_landed = [&] {
    for (size_t i = 0; i < dst.size(); ++i) {
      if (!Holds(dst[i], src[i], 0, 1)) return false;
    }
    return true;
  };
  for (const absl::Time end = absl::Now() + absl::Seconds(20);
       !layer0_landed() && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(layer0_landed()) << "layer 0 was sent but never landed";
  const absl::Time t0 = absl::Now();
  receiver->Cancel("r1");  // returns at once: the blocks could go back to the pool now
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(100));
  Touch(dir_ + "/go");
  auto status = child.Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "the sender failed: see its stderr above";
  for (size_t i = 0; i < dst.size(); ++i) {
    ASSERT_TRUE(Holds(dst[i], src[i], 0, 1))
        << "layer 0, landed before the cancel, was lost: block " << dst[i];
    ASSERT_TRUE(IsZero(dst[i], 1, kGeometry.num_layers))
        << "a layer landed after the cancel, block " << dst[i];
  }
}

TEST_F(KvLinkTest, AKilledSenderFailsItsTransferWithinTheTimeout) {
  auto receiver = Receiver(absl::Seconds(5));
  ASSERT_TRUE(receiver->Expect("r1", Shuffled(kGeometry.num_blocks, kReserved, 4), "").ok());
  Subprocess child = SpawnSender("pause", receiver->port());
  ASSERT_TRUE(WaitForFile(dir_ + "/layer0", absl::Seconds(60)));
  child.Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  auto w = receiver->Wait("r1", absl::Seconds(30));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable) << w.status();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5 + 2));
  (void)child.Wait(absl::Seconds(10));
}

// The peer joined and lives, but never sends: nothing fails on its own, so the receive's deadline
// must end it, abort the communicator (a later call fails at once) and leave no thread waiting.
// While it waits, the device's other work (here: memory allocated and freed) must not wait for it.
TEST_F(KvLinkTest, AReceiveFromASilentPeerEndsAtItsDeadlineAndAbortsTheLink) {
  auto rendezvous = device_->links->NewRendezvous();
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status();
  {
    std::ofstream out(dir_ + "/rendezvous.tmp", std::ios::binary);
    out << *rendezvous;
  }
  std::filesystem::rename(dir_ + "/rendezvous.tmp", dir_ + "/rendezvous");
  Subprocess child = SpawnSender("silent", 0);
  const int64_t links_before = device_->links->live_links();
  auto link = device_->links->Join(*rendezvous, 1, absl::Seconds(60));
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(device_->links->live_links(), links_before + 1);  // (the tandem_kv_links gauge)
  ASSERT_TRUE(WaitForFile(dir_ + "/joined", absl::Seconds(30)));
  const std::vector<int32_t> dst = Shuffled(kGeometry.num_blocks, 300, 6);
  bool landed = false;
  const KvLink::Landing land = [&](const std::function<void()>& write) {
    landed = true;
    write();
  };
  absl::Time t0 = absl::Now();
  absl::Status s;
  absl::Duration took;
  std::thread receive([&] {
    s = (*link)->RecvLayer(0, dst, land, absl::Seconds(2));
    took = absl::Now() - t0;
  });
  // Meanwhile the same device's engine thread grows and frees memory (scratch for a longer batch):
  // a free that synchronised the whole device would wait for the receive's deadline.
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time alloc0 = absl::Now();
  // (checked after the join: a failed ASSERT here would leave the thread running)
  absl::Status allocated;
  for (int round = 0; round < 3 && allocated.ok(); ++round) {
    allocated = device_->backend->Allocate(size_t{4} << 20).status();
  }
  if (allocated.ok()) allocated = device_->backend->CheckErrors();
  const absl::Duration alloc_took = absl::Now() - alloc0;
  receive.join();
  EXPECT_TRUE(allocated.ok()) << allocated;
  EXPECT_LT(alloc_took, absl::Milliseconds(500))
      << "freeing device memory waited for another stream's receive";
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("aborted"));
  EXPECT_GE(took, absl::Milliseconds(1900));
  EXPECT_LT(took, absl::Seconds(4));
  EXPECT_FALSE(landed);
  t0 = absl::Now();
  const absl::Status again = (*link)->RecvLayer(1, dst, land, absl::Seconds(5));
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable) << again;
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(100)) << "a call on an aborted link waited";
  link->reset();  // tears the aborted link down without waiting for the peer
  EXPECT_EQ(device_->links->live_links(), links_before);
  for (int32_t b : dst) ASSERT_TRUE(IsZero(b)) << "block " << b;
  Touch(dir_ + "/go");
  auto status = child.Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "the silent peer failed: see its stderr above";
}

// Any process on the machine can see the CUDA IPC rendezvous' socket (/proc/net/unix) and connect
// to it first. One that does not know the secret, which travels only in the KV handshake reply, is
// turned away, and the sender joins after it.
TEST_F(KvLinkTest, ACudaIpcRendezvousTurnsAwayConnectionsWithoutItsSecret) {
  if (link_kind != "cuda-ipc") GTEST_SKIP() << "the CUDA IPC link's rendezvous only";
  auto rendezvous = device_->links->NewRendezvous();
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status();
  const std::string name =
      rendezvous->substr(0, rendezvous->rfind('-'));  // the secret follows the last '-'
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const int stranger = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(stranger, reinterpret_cast<sockaddr*>(&addr),
                      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())),
            0);
  const std::string garbage(512, 'x');  // a hello's worth and more, without the secret
  ASSERT_EQ(::send(stranger, garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  {
    std::ofstream out(dir_ + "/rendezvous.tmp", std::ios::binary);
    out << *rendezvous;
  }
  std::filesystem::rename(dir_ + "/rendezvous.tmp", dir_ + "/rendezvous");
  Subprocess child = SpawnSender("silent", 0);
  auto link = device_->links->Join(*rendezvous, 1, absl::Seconds(60));
  ASSERT_TRUE(link.ok()) << link.status();
  char byte;
  const ssize_t got =
      ::recv(stranger, &byte, 1, 0);  // closed (reset: the rest of its bytes unread)
  EXPECT_TRUE(got == 0 || (got < 0 && errno == ECONNRESET))
      << "the stranger's connection was not closed";
  ::close(stranger);
  link->reset();  // unmaps the sender's staging, which it may then free
  Touch(dir_ + "/go");
  auto status = child.Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "the sender failed: see its stderr above";
}

TEST_F(KvLinkTest, AJoinNobodyAnswersTimesOut) {
  auto rendezvous = device_->links->NewRendezvous();
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status();
  const absl::Time t0 = absl::Now();
  auto link = device_->links->Join(*rendezvous, 1, absl::Seconds(2));
  EXPECT_EQ(link.status().code(), absl::StatusCode::kDeadlineExceeded) << link.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(4));
  EXPECT_EQ(device_->links->Join("too short", 0, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Entries of a /proc/self directory: the process's threads (task) or descriptors (fd).
int CountEntries(const char* dir) {
  int n = 0;
  for (auto it = std::filesystem::directory_iterator(dir);
       it != std::filesystem::directory_iterator(); ++it)
    ++n;
  return n;
}

// What NewRendezvous starts waits for the ranks: NCCL's bootstrap root (a thread and a socket, with
// no timeout of its own), the CUDA IPC link's listening socket. A rendezvous nobody joins, or that
// only this end joins, is given up (Abandon) without leaving them behind: after a first round
// (NCCL's one-time threads), three more leave at most one thread and two descriptors. Then, for the
// record, the same rounds without Abandon.
TEST_F(KvLinkTest, AbandonedRendezvousLeaveNoThreadsOrSockets) {
  auto round = [&](bool abandon) {
    auto nobody = device_->links->NewRendezvous();
    ASSERT_TRUE(nobody.ok()) << nobody.status();
    if (abandon) device_->links->Abandon(*nobody, {0, 1});
    auto half = device_->links->NewRendezvous();
    ASSERT_TRUE(half.ok()) << half.status();
    EXPECT_FALSE(device_->links->Join(*half, 1, absl::Milliseconds(500)).ok());
    if (abandon) device_->links->Abandon(*half, {0});
  };
  round(true);
  absl::SleepFor(absl::Milliseconds(300));
  const int threads = CountEntries("/proc/self/task"), fds = CountEntries("/proc/self/fd");
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 3; ++i) round(true);
  const absl::Duration took = absl::Now() - t0;
  absl::SleepFor(absl::Milliseconds(500));  // roots that were let go exit
  const int threads_after = CountEntries("/proc/self/task"),
            fds_after = CountEntries("/proc/self/fd");
  std::printf("abandoned rendezvous: 3 rounds in %s; threads %d -> %d, descriptors %d -> %d\n",
              absl::FormatDuration(took).c_str(), threads, threads_after, fds, fds_after);
  EXPECT_LE(threads_after, threads + 1);
  EXPECT_LE(fds_after, fds + 2);
  const absl::Duration stand_in_limit =
      absl::Seconds(5);  // NcclKvLinkFactory::kStandInTimeout (in the plugin)
  EXPECT_LT(took, 3 * (absl::Milliseconds(500) + 2 * stand_in_limit));
  for (int i = 0; i < 3; ++i) round(false);
  absl::SleepFor(absl::Milliseconds(500));
  std::printf("the same 3 rounds without Abandon: threads %d -> %d, descriptors %d -> %d\n",
              threads_after, CountEntries("/proc/self/task"), fds_after,
              CountEntries("/proc/self/fd"));
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  // --link=nccl|cuda-ipc, anywhere (taken out before gtest sees the rest).
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--link=", 0) == 0) {
      tandem::link_kind = a.substr(7);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  if (tandem::link_kind != "nccl" && tandem::link_kind != "cuda-ipc") {
    std::fprintf(stderr, "kv_link_test: --link must be nccl or cuda-ipc\n");
    return 2;
  }
  if (argc == 5 && std::string(argv[1]) == "--sender") {
    int port = 0;
    if (!absl::SimpleAtoi(argv[3], &port)) return 2;
    return tandem::RunSender(argv[2], port, argv[4]);
  }
  ::setenv("NCCL_HOSTID", "tandem-nccl-link-test-receiver", 1);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);  // the pair talks over loopback (the sender inherits it)
  ::testing::InitGoogleTest(&argc, argv);
  if (auto b = tandem::CreateBackend({.device = "cuda"}); !b.ok()) {
    const std::string why(b.status().message());
    std::printf("%s: %s\n", why.find("no CUDA device") != std::string::npos ? "SKIPPED" : "FAILED",
                why.c_str());
    return why.find("no CUDA device") != std::string::npos ? 77 : 1;
  }
  return RUN_ALL_TESTS();
}
