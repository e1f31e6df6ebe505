// RingServer (ring_server.h) serving a FakeService on a real pool, its
// thread running in this process: a request in an attached slot's ring is
// served and its reply arrives; an unattached slot's is not, until its bit
// is set; the doorbell wakes a server asleep on it (the server would
// otherwise sleep for an hour); Stop() returns while it sleeps; a request
// ends an idle-work slice. And the policies it relies on: when a client
// rings the doorbell (doorbell.h), and how long the server polls
// (spin_window.h).
#include "mooncake_cxl/control/ring_server.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/control/doorbell.h"
#include "mooncake_cxl/control/shm_ring.h"
#include "mooncake_cxl/control/spin_window.h"
#include "mooncake_cxl/pool/pool.h"
#include "test_util/deadline.h"
#include "test_util/fake_service.h"
#include "test_util/shm_dir.h"
#include "test_util/wire.h"

namespace mcxl {
namespace {

using testutil::FakeService;
using testutil::Frame;
using testutil::kGuard;
using testutil::kMiB;

using testutil::kGuardNs;

constexpr uint64_t kHourMs = 3600 * 1000;

class RingServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel(LogLevel::kError);
    auto p = Pool::Open(dir_.File("pool"), 8 * kMiB, true);
    ASSERT_TRUE(p.ok());
    pool_ = std::move(p.value());
    FormatOptions fo;
    fo.client_slots = 4;
    ASSERT_TRUE(pool_->Format(fo).ok());
    service_ = std::make_unique<FakeService>(pool_.get());
  }
  void TearDown() override {
    server_.reset();  // stops the thread before the pool goes
    service_.reset();
    pool_.reset();
    SetLogLevel(LogLevel::kInfo);
  }
  void StartServer(uint64_t idle_wake_ms) {
    server_ = std::make_unique<RingServer>(service_.get(), 50000, RingServer::kDefaultMaxSpinNs, idle_wake_ms);
    server_->Start();
  }
  Superblock* sb() const { return pool_->superblock(); }
  // What a client does for a request: push it, then ring the doorbell.
  // Returns RingDoorbell's answer (true: it woke a sleeping server).
  bool Request(uint32_t slot, uint64_t id, const std::string& payload) {
    ShmRing requests(pool_->ring(slot, 0), pool_->geometry().ring_bytes);
    EXPECT_TRUE(requests.Push(MakeFrame(MessageType::kPing, id, payload)));
    return RingDoorbell(sb());
  }
  // The next reply in `slot`'s reply ring (waits for it within the guard).
  Frame Reply(uint32_t slot) {
    ShmRing replies(pool_->ring(slot, 1), pool_->geometry().ring_bytes);
    Frame f;
    if (!replies.WaitForData(30000, kGuardNs)) {
      ADD_FAILURE() << "no reply in slot " << slot;
      return f;
    }
    std::string bytes;
    EXPECT_EQ(replies.Pop(&bytes), ShmRing::PopResult::kOk);
    EXPECT_TRUE(testutil::SplitFrame(bytes, &f));
    return f;
  }
  // Waits until the server's state word says `state`, or the guard.
  bool WaitForState(uint32_t state) {
    return testutil::WaitUntil([&] { return sb()->ring_server_sleeping.load() == state; });
  }

  testutil::ShmDir dir_{"ring_server_test"};
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<FakeService> service_;
  std::unique_ptr<RingServer> server_;
};

TEST_F(RingServerTest, RequestInAnAttachedSlotIsServed) {
  service_->SetAttached(2, true);
  StartServer(kHourMs);
  for (uint64_t id = 1; id <= 100; ++id) {
    Request(2, id, "ping " + std::to_string(id));
    Frame f = Reply(2);
    EXPECT_EQ(f.header.request_id, id);
    EXPECT_EQ(f.header.type, uint16_t(MessageType::kPing));
    EXPECT_EQ(f.payload, "ping " + std::to_string(id));
  }
  EXPECT_EQ(service_->served_slots(), std::set<uint32_t>{2});
}

TEST_F(RingServerTest, UnattachedSlotIsNotServedUntilItsBitIsSet) {
  service_->SetAttached(1, true);
  StartServer(kHourMs);
  Request(0, 7, "early");  // slot 0: not attached
  Request(1, 1, "a");
  EXPECT_EQ(Reply(1).payload, "a");
  // A second round trip: the server has scanned every slot since slot 0's
  // request was pushed (it was pushed before slot 1's first request).
  Request(1, 2, "b");
  EXPECT_EQ(Reply(1).payload, "b");
  EXPECT_EQ(service_->calls("early"), 0);
  EXPECT_EQ(service_->served_slots().count(0), 0u);
  service_->SetAttached(0, true);
  RingDoorbell(sb());
  Frame f = Reply(0);
  EXPECT_EQ(f.header.request_id, 7u);
  EXPECT_EQ(f.payload, "early");
}

TEST_F(RingServerTest, DoorbellWakesASleepingServer) {
  service_->SetAttached(3, true);
  StartServer(kHourMs);  // asleep, only the doorbell (or Stop) wakes it
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(WaitForState(kRingServerAsleep)) << round;
    EXPECT_GE(service_->ticks(), uint64_t(round + 1)) << "it ticks before it sleeps";
    EXPECT_TRUE(Request(3, 10 + round, "wake")) << "the doorbell did not see it asleep";
    Frame f = Reply(3);
    EXPECT_EQ(f.header.request_id, uint64_t(10 + round));
  }
}

TEST_F(RingServerTest, StopReturnsWhileTheServerSleeps) {
  StartServer(kHourMs);
  ASSERT_TRUE(WaitForState(kRingServerAsleep));
  auto stopped = std::async(std::launch::async, [this] { server_->Stop(); });
  if (stopped.wait_for(kGuard) != std::future_status::ready) {
    ADD_FAILURE() << "Stop() did not return";
    std::abort();  // the thread cannot be joined: do not hang the suite
  }
  EXPECT_EQ(sb()->ring_server_sleeping.load(), 0u);
}

TEST_F(RingServerTest, RequestEndsAnIdleWorkSlice) {
  service_->SetAttached(1, true);
  service_->set_idle_work_wanted(true);
  StartServer(kHourMs);
  ASSERT_TRUE(service_->WaitIdleWorkStarted());
  EXPECT_EQ(sb()->ring_server_sleeping.load(), kRingServerEvicting);
  // Evicting: the doorbell is rung (the count moves) but no futex is woken.
  uint32_t bell = sb()->ring_doorbell.load();
  EXPECT_FALSE(Request(1, 5, "during idle work"));
  EXPECT_EQ(sb()->ring_doorbell.load(), bell + 1);
  EXPECT_TRUE(service_->WaitIdleWorkInterrupted());
  EXPECT_EQ(Reply(1).payload, "during idle work");
}

TEST(RingDoorbellTest, WrittenOnlyWhenTheServerIsNotPolling) {
  struct alignas(kCacheLine) Bytes {
    uint8_t b[kSuperblockSize] = {};
  };
  auto mem = std::make_unique<Bytes>();
  auto* sb = reinterpret_cast<Superblock*>(mem->b);
  EXPECT_FALSE(RingDoorbell(sb));  // polling: the server sees the head; the line stays untouched
  EXPECT_EQ(sb->ring_doorbell.load(), 0u);
  sb->ring_server_sleeping.store(kRingServerEvicting);
  EXPECT_FALSE(RingDoorbell(sb));  // ends the eviction slice early (the server is up: no wake-up)
  EXPECT_EQ(sb->ring_doorbell.load(), 1u);
  sb->ring_server_sleeping.store(kRingServerAsleep);
  EXPECT_TRUE(RingDoorbell(sb));  // and wakes the futex (nobody waits here): the caller spins longer
  EXPECT_EQ(sb->ring_doorbell.load(), 2u);
}

TEST(SpinWindowTest, WidensForAPaceItMissesAndNarrowsAfterPauses) {
  SpinWindow w(50000, 500000);
  EXPECT_EQ(w.ns(), 50000u);
  w.Arrived(0);  // back to back
  w.Arrived(40000);  // caught while polling
  EXPECT_EQ(w.ns(), 50000u);
  w.Arrived(120000);  // missed (a sleep and a wake-up): cover it with margin
  EXPECT_EQ(w.ns(), 180000u);
  w.Arrived(150000);  // caught now
  EXPECT_EQ(w.ns(), 180000u);
  w.Arrived(400000);  // beyond 1.5x is beyond the max: the max
  EXPECT_EQ(w.ns(), 500000u);
  w.Arrived(3000000000ull);  // a pause: halves, down to the base
  EXPECT_EQ(w.ns(), 250000u);
  for (int i = 0; i < 10; ++i) w.Arrived(3000000000ull);
  EXPECT_EQ(w.ns(), 50000u);
  SpinWindow fixed(50000, 0);  // max below the base: the window never moves
  fixed.Arrived(60000);
  EXPECT_EQ(fixed.ns(), 50000u);
}

}  // namespace
}  // namespace mcxl
