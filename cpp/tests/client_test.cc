// Client (client.h) against a Master in this process, served as the master
// binary serves it: TcpServer and RingServer on threads, TCP on 127.0.0.1
// at a free port. Every test runs with the control path over the CXL RPC
// rings and over TCP only: connect and attach, put/get/is_exist/remove of
// a 4 KiB value, batch put and get, get_into scattered over caller
// buffers, a value replaced by an upsert (and kept by a plain put), a
// missing key, oversized keys and empty values refused with
// INVALID_PARAMS, close (then every call UNAVAILABLE_IN_CURRENT_STATUS) and
// a new attach, and a pinned view that outlives a remove of its key.
#include "mooncake_cxl/client/client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_cxl/control/ring_server.h"
#include "mooncake_cxl/control/tcp_server.h"
#include "test_util/deadline.h"
#include "test_util/master_fixture.h"

namespace mcxl {
namespace {

using testutil::kMiB;
using testutil::ValueFor;

enum class Path { kRings, kTcp };
void PrintTo(Path p, std::ostream* os) { *os << (p == Path::kRings ? "rings" : "tcp"); }

class ClientTest : public testutil::MasterFixture, public ::testing::WithParamInterface<Path> {
 protected:
  void SetUp() override {
    MasterFixture::SetUp();
    if (HasFatalFailure()) return;
    config_.cxl_size = 16 * kMiB;  // small enough to fill
    StartMaster();
    if (HasFatalFailure()) return;
    tcp_ = std::make_unique<TcpServer>(master_.get());
    ASSERT_TRUE(tcp_->Listen("127.0.0.1", 0).ok());
    tcp_thread_ = std::thread([this] { tcp_->Run(stop_); });
    rings_ = std::make_unique<RingServer>(master_.get());
    rings_->Start();
  }
  void TearDown() override {
    for (auto& c : clients_) (void)c->Close();
    clients_.clear();
    if (rings_) rings_->Stop();
    stop_.store(true);
    if (tcp_thread_.joinable()) tcp_thread_.join();
    rings_.reset();
    tcp_.reset();
    MasterFixture::TearDown();
  }

  ClientOptions Options(const std::string& name) const {
    ClientOptions o;
    o.local_hostname = name;
    o.master_addr = "127.0.0.1:" + std::to_string(tcp_->port());
    o.use_rings = GetParam() == Path::kRings;
    o.rpc_timeout_ms = 60000;  // a loaded machine is slow, never wrong
    return o;
  }
  // A connected client, closed at TearDown if the test did not.
  std::shared_ptr<Client> Connect(const std::string& name = "client_test:1") {
    auto c = Client::Connect(Options(name));
    EXPECT_TRUE(c.ok()) << ErrorCodeName(c.error());
    if (!c.ok()) return nullptr;
    clients_.push_back(*c);
    return *c;
  }

  static ErrorCode PutValue(Client& c, const std::string& key, const std::string& value, bool upsert = false) {
    ConstSlice part{value.data(), value.size()};
    return c.PutOne(key, &part, 1, PutOptions{}, upsert);
  }
  // The value as a reader copies it, or the lookup's error.
  static Result<std::string> GetValue(Client& c, const std::string& key, size_t capacity = 4 * kMiB) {
    std::string buf(capacity, '\0');
    MutSlice dst{buf.data(), buf.size()};
    auto n = c.GetInto(key, &dst, 1);
    if (!n.ok()) return n.error();
    buf.resize(*n);
    return buf;
  }
  // Requests pushed into any client's request ring so far.
  uint64_t RingRequests() const {
    uint64_t heads = 0;
    for (uint32_t s = 0; s < master_->pool().geometry().client_slot_count; ++s)
      heads += master_->pool().ring(s, 0)->head.load();
    return heads;
  }

  std::unique_ptr<TcpServer> tcp_;
  std::unique_ptr<RingServer> rings_;
  std::atomic<bool> stop_{false};  // the server loop polls it; seq_cst stores and loads (the default)
  std::thread tcp_thread_;
  std::vector<std::shared_ptr<Client>> clients_;
};

INSTANTIATE_TEST_SUITE_P(ControlPath, ClientTest, ::testing::Values(Path::kRings, Path::kTcp),
                         [](const ::testing::TestParamInfo<Path>& p) {
                           return p.param == Path::kRings ? "Rings" : "Tcp";
                         });

TEST_P(ClientTest, ConnectsAndAttaches) {
  auto a = Connect("client_test:a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(master_->stats().attached_clients, 1u);
  EXPECT_EQ(a->HealthCheck(), 0);
  EXPECT_FALSE(a->closed());
  EXPECT_EQ(a->pool()->path(), config_.cxl_path);
  EXPECT_EQ(a->local_hostname(), "client_test:a");
  auto b = Connect("client_test:b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(master_->stats().attached_clients, 2u);
}

TEST_P(ClientTest, PutGetIsExistRemoveOfA4KiBValue) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const uint64_t rings_before = RingRequests();
  const std::string v = ValueFor("k4", 4096);
  EXPECT_EQ(PutValue(*c, "k4", v), ErrorCode::OK);
  EXPECT_EQ(c->IsExist("k4"), 1);
  auto size = c->GetSize("k4");
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 4096u);
  auto got = GetValue(*c, "k4");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == v);
  // A read grants a lease: an unforced remove is refused while it lasts.
  EXPECT_EQ(c->Remove("k4", false), ErrorCode::OBJECT_HAS_LEASE);
  EXPECT_EQ(c->Remove("k4", true), ErrorCode::OK);
  EXPECT_EQ(c->IsExist("k4"), 0);
  EXPECT_EQ(GetValue(*c, "k4").error(), ErrorCode::OBJECT_NOT_FOUND);
  // The put and the removes went over the path this test asked for.
  if (GetParam() == Path::kRings)
    EXPECT_GT(RingRequests(), rings_before);
  else
    EXPECT_EQ(RingRequests(), rings_before);
}

TEST_P(ClientTest, BatchPutAndBatchGetInto) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const std::vector<size_t> sizes = {1, 100, 4096, 4097, 65536, kMiB, 3 * kMiB + 5};
  std::vector<std::string> keys, values;
  for (size_t i = 0; i < sizes.size(); ++i) {
    keys.push_back("batch/" + std::to_string(i));
    values.push_back(ValueFor(keys.back(), sizes[i]));
  }
  std::vector<std::string_view> kv(keys.begin(), keys.end());
  std::vector<PutParts> parts;
  for (const std::string& v : values) {
    // Each value in two parts (a header and a body, as a caller's KV page might be).
    size_t half = v.size() / 2;
    parts.push_back({ConstSlice{v.data(), half}, ConstSlice{v.data() + half, v.size() - half}});
  }
  std::vector<ErrorCode> put = c->Put(kv, parts, PutOptions{}, false);
  EXPECT_EQ(put, std::vector<ErrorCode>(keys.size(), ErrorCode::OK));

  // Read back with one missing key and one the caller skips.
  kv.push_back("batch/missing");
  kv.push_back("batch/skipped");
  std::vector<std::string> bufs;
  for (size_t i = 0; i < kv.size(); ++i) bufs.emplace_back(i < sizes.size() ? sizes[i] : 16, '\0');
  std::vector<MutSlice> dsts;
  std::vector<size_t> first;
  for (std::string& b : bufs) {
    first.push_back(dsts.size());
    dsts.push_back(MutSlice{b.data(), b.size()});
  }
  first.push_back(dsts.size());
  std::vector<int64_t> out(kv.size(), 0);
  out.back() = ToInt(ErrorCode::INVALID_PARAMS);  // preset: skipped
  c->BatchGetInto(kv, dsts, first, &out);
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(out[i], int64_t(sizes[i])) << keys[i];
    EXPECT_TRUE(bufs[i] == values[i]) << keys[i];
  }
  EXPECT_EQ(out[sizes.size()], ToInt(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(out.back(), ToInt(ErrorCode::INVALID_PARAMS));
}

TEST_P(ClientTest, GetIntoScattersOverCallerBuffers) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const std::string v = ValueFor("scatter", 10000);
  ASSERT_EQ(PutValue(*c, "scatter", v), ErrorCode::OK);
  std::string a(3000, '\0'), b(7000, '\0');
  MutSlice exact[] = {{a.data(), a.size()}, {b.data(), b.size()}};
  auto n = c->GetInto("scatter", exact, 2);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 10000u);
  EXPECT_TRUE(a + b == v);
  MutSlice small[] = {{a.data(), a.size()}, {b.data(), b.size() - 1}};
  EXPECT_EQ(c->GetInto("scatter", small, 2).error(), ErrorCode::INVALID_PARAMS);
  std::string big(20000, 'x');
  MutSlice roomy{big.data(), big.size()};
  n = c->GetInto("scatter", &roomy, 1);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 10000u);
  EXPECT_TRUE(big.substr(0, 10000) == v);
  EXPECT_EQ(big.substr(10000), std::string(10000, 'x'));  // nothing written past the value
}

TEST_P(ClientTest, UpsertReplacesAValueAndAPlainPutKeepsIt) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(PutValue(*c, "u", std::string(1000, 'a')), ErrorCode::OK);
  EXPECT_EQ(PutValue(*c, "u", std::string(2000, 'b')), ErrorCode::OK);  // exists: success, not overwritten
  EXPECT_EQ(GetValue(*c, "u").value(), std::string(1000, 'a'));
  EXPECT_EQ(PutValue(*c, "u", std::string(5000, 'c'), true), ErrorCode::OK);
  EXPECT_EQ(GetValue(*c, "u").value(), std::string(5000, 'c'));
  EXPECT_EQ(PutValue(*c, "u", std::string(10, 'd'), true), ErrorCode::OK);
  EXPECT_EQ(GetValue(*c, "u").value(), std::string(10, 'd'));
  EXPECT_EQ(c->GetSize("u").value(), 10u);
  master_->Tick();  // the older values go
  EXPECT_EQ(master_->stats().complete_keys, 1u);
  // An upsert of a key that does not exist is a put.
  EXPECT_EQ(PutValue(*c, "fresh", "v", true), ErrorCode::OK);
  EXPECT_EQ(GetValue(*c, "fresh").value(), "v");
}

TEST_P(ClientTest, MissingKeyIsNotFound) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->IsExist("nothing"), 0);
  EXPECT_EQ(c->GetSize("nothing").error(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(GetValue(*c, "nothing").error(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(c->PinValue("nothing").error(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(c->Remove("nothing", false), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(c->BatchRemove({"nothing"}, false), std::vector<int32_t>{ToInt(ErrorCode::OBJECT_NOT_FOUND)});
}

TEST_P(ClientTest, OversizedKeysAndEmptyValuesAreRefused) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const std::string longest(kMaxKeyLength, 'k'), too_long(kMaxKeyLength + 1, 'k');
  EXPECT_EQ(PutValue(*c, too_long, "v"), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(GetValue(*c, too_long).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_LT(c->IsExist(too_long), 0);
  EXPECT_EQ(c->Remove(too_long, true), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(PutValue(*c, "", "v"), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(PutValue(*c, "empty", ""), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(c->IsExist("empty"), 0);
  // The longest key is fine (its request is too big for a ring: it goes over TCP).
  EXPECT_EQ(PutValue(*c, longest, "v"), ErrorCode::OK);
  EXPECT_EQ(GetValue(*c, longest).value(), "v");
  // In a batch, each key is judged on its own.
  std::string good = "good";
  std::vector<std::string_view> keys = {"good", "empty", too_long};
  std::vector<PutParts> values = {{ConstSlice{good.data(), good.size()}}, {}, {ConstSlice{good.data(), 4}}};
  EXPECT_EQ(c->Put(keys, values, PutOptions{}, false),
            (std::vector<ErrorCode>{ErrorCode::OK, ErrorCode::INVALID_PARAMS, ErrorCode::INVALID_PARAMS}));
  EXPECT_EQ(GetValue(*c, "good").value(), "good");
  master_->Tick();
  EXPECT_EQ(master_->stats().complete_keys, 2u);
}

TEST_P(ClientTest, BatchIsExistJudgesEachKeyAndLeasesWhatItFinds) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(PutValue(*c, "here", "v"), ErrorCode::OK);
  ASSERT_EQ(PutValue(*c, "also", "w"), ErrorCode::OK);
  ASSERT_EQ(PutValue(*c, "unread", "u"), ErrorCode::OK);
  const std::string too_long(kMaxKeyLength + 1, 'k');
  std::vector<std::string_view> keys = {"here", "absent", too_long, "also"};
  auto got = c->BatchIsExist(keys);
  ASSERT_EQ(got.size(), keys.size());
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[1], 0);
  EXPECT_LT(got[2], 0);  // refused alone: the other keys are still answered
  EXPECT_EQ(got[3], 1);
  // As IsExist, a hit grants a lease: an unforced remove is refused while it
  // lasts (the key nobody looked up goes).
  EXPECT_EQ(c->Remove("also", false), ErrorCode::OBJECT_HAS_LEASE);
  EXPECT_EQ(c->Remove("unread", false), ErrorCode::OK);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(got[i], c->IsExist(keys[i])) << keys[i];
  EXPECT_TRUE(c->Close().ok());
  for (int r : c->BatchIsExist(keys)) EXPECT_EQ(r, ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
}

TEST_P(ClientTest, AfterCloseEveryCallIsUnavailableAndANewClientAttaches) {
  auto c = Connect("client_test:first");
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(PutValue(*c, "kept", "value"), ErrorCode::OK);
  EXPECT_TRUE(c->Close().ok());
  EXPECT_TRUE(c->closed());
  EXPECT_EQ(master_->stats().attached_clients, 0u);  // Close detached it
  EXPECT_EQ(c->HealthCheck(), 1);
  EXPECT_EQ(PutValue(*c, "after", "v"), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  EXPECT_EQ(GetValue(*c, "kept").error(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  EXPECT_LT(c->IsExist("kept"), 0);
  EXPECT_EQ(c->Remove("kept", true), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  EXPECT_EQ(c->RemoveAll(true).error(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  EXPECT_TRUE(c->Close().ok());  // twice is fine
  // The store outlives its clients: a new one attaches and sees the value.
  auto again = Connect("client_test:first");
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(master_->stats().attached_clients, 1u);
  EXPECT_EQ(GetValue(*again, "kept").value(), "value");
  EXPECT_EQ(PutValue(*again, "after", "v"), ErrorCode::OK);
  EXPECT_EQ(again->RemoveAll(true).value(), 2u);  // a whole-index scan: over TCP on either path
}

// Close while threads read: every read either completes before Close
// returns or is refused, and none started after it returns succeeds.
TEST_P(ClientTest, CloseWhileThreadsReadLetsNoReadThroughAfterIt) {
  constexpr int kThreads = 3;
  constexpr uint64_t kReadsBeforeClose = 200;  // per thread
  auto c = Connect("client_test:closing");
  ASSERT_NE(c, nullptr);
  const std::string v = ValueFor("read", 4096);
  ASSERT_EQ(PutValue(*c, "read", v), ErrorCode::OK);
  // seq_cst (the default): test bookkeeping.
  std::atomic<bool> close_returned{false};
  std::atomic<uint64_t> late_successes{0}, wrong_values{0};
  std::vector<std::atomic<uint64_t>> reads(kThreads);
  std::vector<std::thread> readers;
  for (int t = 0; t < kThreads; ++t) {
    readers.emplace_back([&, t] {
      for (uint64_t i = 0;; ++i) {
        bool after = close_returned.load();
        bool ok;
        if (i % 2 == 0) {
          auto got = GetValue(*c, "read", 8192);
          ok = got.ok();
          if (ok && *got != v) wrong_values.fetch_add(1);
        } else {
          ok = c->IsExist("read") == 1;
        }
        if (ok && after) late_successes.fetch_add(1);
        if (!ok) break;  // refused: the client is closed
        reads[t].fetch_add(1);
      }
    });
  }
  for (int t = 0; t < kThreads; ++t)
    while (reads[t].load() < kReadsBeforeClose) std::this_thread::yield();
  EXPECT_TRUE(c->Close().ok());
  close_returned.store(true);
  for (auto& r : readers) r.join();
  EXPECT_EQ(late_successes.load(), 0u);
  EXPECT_EQ(wrong_values.load(), 0u);
  EXPECT_EQ(GetValue(*c, "read").error(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
}

TEST_P(ClientTest, PinnedViewOutlivesARemoveUntilUnpinned) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const std::string v = ValueFor("viewed", 4096);
  ASSERT_EQ(PutValue(*c, "viewed", v), ErrorCode::OK);
  auto view = c->PinValue("viewed");
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->size, 4096u);
  EXPECT_EQ(c->Remove("viewed", true), ErrorCode::OK);
  EXPECT_EQ(c->IsExist("viewed"), 0);
  // Fill the pool over and over: the viewed extent is never handed out.
  for (int i = 0; i < 32; ++i) {  // twice the pool
    std::string key = "filler/" + std::to_string(i);
    ASSERT_EQ(PutValue(*c, key, ValueFor(key, kMiB)), ErrorCode::OK) << key;
  }
  EXPECT_GT(master_->stats().evicted_keys, 0u);
  EXPECT_TRUE(c->PinHeld(*view));
  EXPECT_TRUE(std::string(view->data, view->size) == v) << "the viewed bytes changed";
  // Unpinned, the extent is freed at one of the master's next rounds.
  const uint64_t before = master_->stats().allocated_bytes;
  c->Unpin(*view);
  testutil::WaitUntil([&] { return master_->stats().allocated_bytes < before; }, [&] { master_->Tick(); });
  EXPECT_EQ(master_->stats().allocated_bytes, before - ExtentBytes(6, 4096)) << "the view's extent was never freed";
}

// No master at the address: Connect fails, it does not hang.
TEST(ClientConnectTest, NoMasterListeningIsRpcFail) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(s);  // a free port that nobody listens on
  ClientOptions o;
  o.local_hostname = "client_test:nobody";
  o.master_addr = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  SetLogLevel(LogLevel::kError);
  auto c = Client::Connect(o);
  SetLogLevel(LogLevel::kInfo);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error(), ErrorCode::RPC_FAIL);
  o.master_addr = "no port here";
  EXPECT_EQ(Client::Connect(o).error(), ErrorCode::INVALID_PARAMS);
}

}  // namespace
}  // namespace mcxl
