// Stalled and reclaimed clients, in process: the quarantine of a revoked
// put's extent (kept while its local writer process lives, or until the
// release timeout for a remote one), and the master serving only the
// current attachment of a slot from its rings.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

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
