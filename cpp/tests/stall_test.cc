// Stalled and reclaimed clients, in process: the quarantine of a revoked
// put's extent (kept while its local writer process lives, or until the
// release timeout for a remote one), ShmRing's Peek/Consume and producer
// tail copy, the doorbell policy, and the ring server serving only the
// current attachment of a slot.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_cxl/control/doorbell.h"
#include "mooncake_cxl/control/ring_server.h"
#include "mooncake_cxl/control/shm_ring.h"
#include "mooncake_cxl/master/master.h"
#include "test_util/master_fixture.h"

namespace mcxl {
namespace {

using testutil::Enc;
using testutil::kMiB;
using testutil::StatusOf;

class StallTest : public testutil::MasterFixture {
 protected:
  void SetUp() override {
    MasterFixture::SetUp();
    config_.put_start_release_timeout_sec = 0;  // a remote owner's quarantine ends at once
  }
  void TearDown() override {
    if (child_ > 0) {
      kill(child_, SIGKILL);
      waitpid(child_, nullptr, 0);
    }
    MasterFixture::TearDown();
  }
  // Ticks until `ms` have passed: the master checks its clients' pids
  // every 500 ms, and a test of that check can only wait for it.
  void TickFor(int ms) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < end) {
      master_->Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  pid_t SpawnSleeper() {
    pid_t pid = fork();
    if (pid == 0) {
      pause();
      _exit(0);
    }
    return pid;
  }

  pid_t child_ = -1;
};

TEST_F(StallTest, RevokedPutOfALiveLocalWriterStaysQuarantinedUntilItExits) {
  StartMaster();
  child_ = SpawnSleeper();
  ASSERT_GT(child_, 0);
  uint64_t empty = master_->stats().allocated_bytes;
  ClientRef c = Attach(AttachRequestFor("client:1", uint64_t(child_)));
  PutStartReply r = PutStart(c, {"stalled"}, {4 * kMiB});
  ASSERT_EQ(r.items.size(), 1u);
  ASSERT_EQ(r.items[0].status, ErrorCode::OK);
  uint64_t with_put = master_->stats().allocated_bytes;
  EXPECT_GT(with_put, empty);
  // The client is gone from the master's view (as past --client_ttl), its
  // process alive: the put is revoked, its extent kept.
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(c))), ErrorCode::OK);
  EXPECT_EQ(master_->stats().revoked_puts, 1u);
  TickFor(700);  // past the release timeout (0 s) and a pid check
  EXPECT_EQ(master_->stats().allocated_bytes, with_put) << "freed while its writer may still run";
  kill(child_, SIGKILL);
  waitpid(child_, nullptr, 0);
  child_ = -1;
  TickFor(700);
  EXPECT_EQ(master_->stats().allocated_bytes, empty) << "not freed after its writer exited";
}

TEST_F(StallTest, RevokedPutOfARemoteWriterIsReleasedAfterTheTimeout) {
  StartMaster();
  uint64_t empty = master_->stats().allocated_bytes;
  ClientRef c = Attach(AttachRequestFor("client:1", 1, "another-host"));
  PutStartReply r = PutStart(c, {"stalled"}, {4 * kMiB});
  ASSERT_EQ(r.items.size(), 1u);
  ASSERT_EQ(r.items[0].status, ErrorCode::OK);
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(c))), ErrorCode::OK);
  TickFor(100);
  EXPECT_EQ(master_->stats().allocated_bytes, empty);
}

TEST(ShmRingTest, PeekLeavesTheRecordUntilConsumed) {
  std::vector<uint64_t> mem(4096 / 8, 0);
  auto* h = reinterpret_cast<RingHeader*>(mem.data());
  ShmRing producer(h, 4096), consumer(h, 4096);
  ASSERT_TRUE(producer.Push("first"));
  ASSERT_TRUE(producer.Push("second"));
  std::string f;
  ShmRing::Position at;
  ASSERT_EQ(consumer.Peek(&f, &at), ShmRing::PopResult::kOk);
  EXPECT_EQ(f, "first");
  ASSERT_EQ(consumer.Peek(&f, &at), ShmRing::PopResult::kOk);  // still there
  EXPECT_EQ(f, "first");
  consumer.Consume(at);
  ASSERT_EQ(consumer.Pop(&f), ShmRing::PopResult::kOk);
  EXPECT_EQ(f, "second");
  EXPECT_EQ(consumer.Peek(&f, &at), ShmRing::PopResult::kEmpty);
}

TEST(ShmRingTest, ProducerRereadsTheTailOnlyWhenItsCopySaysFull) {
  struct alignas(kCacheLine) Bytes {
    uint8_t b[4096] = {};
  };
  auto mem = std::make_unique<Bytes>();
  auto* h = reinterpret_cast<RingHeader*>(mem->b);
  uint64_t copy = 0;  // the producer's tail copy, kept outside (as the master keeps one per slot)
  ShmRing producer(h, 4096, &copy), consumer(h, 4096);
  const std::string rec(200, 'r');
  int pushed = 0;
  while (producer.Push(rec)) ++pushed;  // fills the ring: the copy (0) is the real tail
  ASSERT_GT(pushed, 5);
  EXPECT_EQ(copy, 0u);
  std::string f;
  for (int i = 0; i < pushed; ++i) ASSERT_EQ(consumer.Pop(&f), ShmRing::PopResult::kOk);
  ASSERT_TRUE(producer.Push(rec));  // full by the copy: re-read, room again
  EXPECT_EQ(copy, h->tail.load());
  // A reset ring (both counters 0) with a copy from before: the copy is
  // ahead of head, so it is re-read, and the ring still never over-fills.
  ShmRing::Reset(h);
  int again = 0;
  while (producer.Push(rec)) ++again;
  EXPECT_EQ(again, pushed);
  for (int i = 0; i < again; ++i) {
    ASSERT_EQ(consumer.Pop(&f), ShmRing::PopResult::kOk);
    EXPECT_EQ(f, rec);
  }
  EXPECT_EQ(consumer.Pop(&f), ShmRing::PopResult::kEmpty);
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

TEST(ShmRingTest, RequestIdsTagTheAttachment) {
  uint64_t g1 = (uint64_t(3) << 32) + 17, g2 = (uint64_t(3) << 32) + 18, g3 = (uint64_t(4) << 32) + 17;
  EXPECT_TRUE(RingRequestOf(RingRequestId(g1, 5), g1));
  EXPECT_FALSE(RingRequestOf(RingRequestId(g1, 5), g2));
  EXPECT_FALSE(RingRequestOf(RingRequestId(g1, 5), g3));
  EXPECT_NE(RingRequestId(g1, 5), RingRequestId(g1, 6));
}

TEST_F(StallTest, RingServerServesOnlyTheCurrentAttachment) {
  StartMaster();
  ClientRef a = Attach();
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(a))), ErrorCode::OK);
  ClientRef b = Attach();
  ASSERT_EQ(b.slot, a.slot);
  const Pool& pool = master_->pool();
  uint32_t ring_bytes = pool.superblock()->ring_bytes;
  ShmRing requests(pool.ring(b.slot, 0), ring_bytes), replies(pool.ring(b.slot, 1), ring_bytes);
  // A's stale request (its tag) in B's ring: dropped, no reply, nothing done.
  PutStartRequest req;
  req.client = a;
  req.keys = {"k"};
  req.sizes = {64};
  req.groups = {""};
  ASSERT_TRUE(requests.Push(MakeFrame(MessageType::kPutStart, RingRequestId(a.generation, 1), Enc(req))));
  master_->ServeRing(b.slot);
  std::string f;
  EXPECT_EQ(replies.Pop(&f), ShmRing::PopResult::kEmpty);
  EXPECT_EQ(master_->stats().put_requests, 0u);
  // B's own request is served.
  req.client = b;
  ASSERT_TRUE(requests.Push(MakeFrame(MessageType::kPutStart, RingRequestId(b.generation, 1), Enc(req))));
  master_->ServeRing(b.slot);
  ASSERT_EQ(replies.Pop(&f), ShmRing::PopResult::kOk);
  FrameHeader h;
  memcpy(&h, f.data(), sizeof(h));
  EXPECT_EQ(h.request_id, RingRequestId(b.generation, 1));
  EXPECT_EQ(master_->stats().put_requests, 1u);
}

}  // namespace
}  // namespace mcxl
