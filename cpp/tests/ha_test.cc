// High availability without etcd: endpoint lists, an etcd that does not
// answer, and the write-batch fence between two real processes (a leader
// inside a batch, a new leader taking the term).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/control/etcd_client.h"
#include "mooncake_cxl/master/master_fence.h"
#include "mooncake_cxl/master/master_ha.h"

namespace mcxl {
namespace {

TEST(EtcdClient, SplitsEndpointLists) {
  using V = std::vector<std::string>;
  EXPECT_EQ(EtcdClient::SplitEndpoints("etcd://h1:2379;h2:2379"), (V{"h1:2379", "h2:2379"}));
  EXPECT_EQ(EtcdClient::SplitEndpoints("h1:2379, http://h2:2379,;"), (V{"h1:2379", "h2:2379"}));
  EXPECT_EQ(EtcdClient::SplitEndpoints("etcd://"), V{});
  EXPECT_EQ(EtcdClient::SplitEndpoints(""), V{});
}

TEST(EtcdClient, UnreachableEtcdIsRpcFail) {
  // Port 1 on loopback: nothing listens; every call fails with RPC_FAIL, bounded.
  EtcdClient c({"127.0.0.1:1", "127.0.0.1:1"}, 200);
  auto g = c.LeaseGrant(2);
  ASSERT_FALSE(g);
  EXPECT_EQ(g.error(), ErrorCode::RPC_FAIL);
  auto r = c.Get("k");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), ErrorCode::RPC_FAIL);
}

TEST(EtcdClient, LeaderRecordNamesThisProcess) {
  std::string rec = HaElector::LeaderRecord("127.0.0.1:5", "127.0.0.1:6");
  EXPECT_NE(rec.find("\"rpc\":\"127.0.0.1:5\""), std::string::npos) << rec;
  EXPECT_NE(rec.find("\"pid\":" + std::to_string(getpid())), std::string::npos) << rec;
  EXPECT_EQ(HaElector::LeaderKey("c1"), "mooncake-cxl/c1/leader");
}

Superblock* SharedSuperblock() {
  void* p = mmap(nullptr, sizeof(Superblock), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  memset(p, 0, sizeof(Superblock));
  return static_cast<Superblock*>(p);
}

TEST(FencedMutex, TermOnlyGrows) {
  Superblock* sb = SharedSuperblock();
  EXPECT_EQ(FencedMutex::TakeTerm(sb, 10, 0, true, 0), 10u);
  EXPECT_EQ(FencedMutex::TakeTerm(sb, 7, 0, true, 0), 11u);  // etcd rebuilt: still above the pool's
  EXPECT_EQ(sb->master_term.load(), 11u);
  munmap(sb, sizeof(Superblock));
}

// A leader (child process) inside a write batch when a new leader takes the
// term: the new leader waits for the batch to end, and the old one exits at
// its next batch without writing.
TEST(FencedMutex, NewLeaderWaitsForTheBatchAndTheOldOneStepsDown) {
  Superblock* sb = SharedSuperblock();
  sb->master_term.store(5);
  int in_batch[2], go[2];
  ASSERT_EQ(pipe(in_batch), 0);
  ASSERT_EQ(pipe(go), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    static std::atomic<uint64_t> deadline{~0ull};
    static FencedMutex mu;
    mu.Arm(sb, 5, &deadline);
    mu.lock();
    char c = 'x';
    (void)!write(in_batch[1], &c, 1);
    (void)!read(go[0], &c, 1);
    mu.unlock();
    mu.lock();  // the pool names a newer term: exits here
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(in_batch[0], &c, 1), 1);
  EXPECT_EQ(sb->master_writing.load(), 5u);
  std::atomic<bool> taken{false};
  uint64_t term = 0;
  std::thread t([&] {
    term = FencedMutex::TakeTerm(sb, 9, uint64_t(child), true, 0);
    taken.store(true);
  });
  // The batch is still open and its process alive: the term is written but not taken.
  while (sb->master_term.load() != 9) std::this_thread::yield();
  EXPECT_FALSE(taken.load());
  ASSERT_EQ(write(go[1], "g", 1), 1);
  t.join();
  EXPECT_EQ(term, 9u);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kDeposedExitCode);
  EXPECT_EQ(sb->master_writing.load(), 0u);
  munmap(sb, sizeof(Superblock));
}

TEST(FencedMutex, LapsedLeaseStepsDown) {
  Superblock* sb = SharedSuperblock();
  sb->master_term.store(3);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    static std::atomic<uint64_t> deadline{0};  // lapsed
    static FencedMutex mu;
    mu.Arm(sb, 3, &deadline);
    mu.lock();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kDeposedExitCode);
  munmap(sb, sizeof(Superblock));
}

}  // namespace
}  // namespace mcxl
