// The non-coherent simulator itself (coherence_sim.h), with real processes
// on two and three simulated hosts of one pool file: what a write-back makes
// visible, what a missing write-back or invalidate leaves stale, a cross-host
// atomic losing an update, the checker, the seeded churn, a local store
// racing a refetch; and the three builds of publish.h.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <vector>

#include "mooncake_cxl/pool/coherence_sim.h"
#include "mooncake_cxl/pool/pool.h"
#include "mooncake_cxl/pool/publish.h"
#include "test_util/deadline.h"
#include "test_util/shm_dir.h"

namespace mcxl {
namespace {

constexpr uint64_t kPoolBytes = 4ull << 20;

class CoherenceSimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.File("pool");
    int fd = open(path_.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, off_t(kPoolBytes)), 0);
    close(fd);
    setenv("MC_CXL_SIM_CHURN", "0", 1);  // the tests step the churn themselves
    setenv("MC_CXL_SIM_SEED", "7", 1);
  }
  void TearDown() override {
    unsetenv("MC_CXL_SIM_CHURN");
    unsetenv("MC_CXL_SIM_SEED");
  }

  // Starts a process on simulated host `host` running fn (its exit code is
  // fn's result: 0 = passed).
  pid_t Start(int host, const std::function<int(SimHost&)>& fn) {
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open(path_.c_str(), O_RDWR);
      if (fd < 0) _exit(90);
      auto sim = SimHost::Attach(path_, fd, kPoolBytes, 0600, host);
      if (!sim.ok()) _exit(91);
      int rc = fn(**sim);
      sim.value().reset();
      close(fd);
      _exit(rc);
    }
    return pid;
  }
  static int Wait(pid_t pid) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
  }
  // Runs fn in a process on `host` to its end.
  int OnHost(int host, const std::function<int(SimHost&)>& fn) { return Wait(Start(host, fn)); }

  // The pool file's bytes (what the device holds).
  uint64_t PoolWord(uint64_t off) {
    uint64_t w = 0;
    int fd = open(path_.c_str(), O_RDONLY);
    EXPECT_EQ(pread(fd, &w, 8, off_t(off)), 8);
    close(fd);
    return w;
  }

  testutil::ShmDir dir_{"coherence_sim"};
  std::string path_;
};

uint64_t* At(SimHost& s, uint64_t off) { return reinterpret_cast<uint64_t*>(s.base() + off); }
std::atomic_ref<uint64_t> AtomicAt(SimHost& s, uint64_t off) { return std::atomic_ref<uint64_t>(*At(s, off)); }

TEST_F(CoherenceSimTest, WriteBackMakesBytesVisibleToAnotherHost) {
  constexpr uint64_t kOff = 8192;
  ASSERT_EQ(OnHost(0, [](SimHost& s) {
              *At(s, kOff) = 0x1111;
              s.WriteBack(At(s, kOff), 8);
              return 0;
            }), 0);
  EXPECT_EQ(PoolWord(kOff), 0x1111u);
  EXPECT_EQ(OnHost(1, [](SimHost& s) {
              s.Invalidate(At(s, kOff), 8);
              return *At(s, kOff) == 0x1111 ? 0 : 1;
            }), 0);
}

TEST_F(CoherenceSimTest, MissingWriteBackKeepsTheStoreOnItsHost) {
  constexpr uint64_t kOff = 3 * 4096 + 64;
  ASSERT_EQ(OnHost(0, [](SimHost& s) {
              *At(s, kOff) = 0x2222;  // no write-back: it stays in host 0's "cache"
              return 0;
            }), 0);
  EXPECT_EQ(PoolWord(kOff), 0u);
  EXPECT_EQ(OnHost(1, [](SimHost& s) {
              s.Invalidate(At(s, kOff), 8);
              return *At(s, kOff) == 0 ? 0 : 1;
            }), 0);
  // Another process of host 0 shares the host's copy, and sees it.
  EXPECT_EQ(OnHost(0, [](SimHost& s) { return *At(s, kOff) == 0x2222 ? 0 : 1; }), 0);
  // A write-back by that other process publishes it (the host's dirty line).
  EXPECT_EQ(OnHost(0, [](SimHost& s) {
              s.WriteBack(At(s, kOff), 1);
              return 0;
            }), 0);
  EXPECT_EQ(PoolWord(kOff), 0x2222u);
}

TEST_F(CoherenceSimTest, MissingInvalidateReadsStale) {
  constexpr uint64_t kOff = 64 * 100;
  ASSERT_EQ(OnHost(0, [](SimHost& s) {
              *At(s, kOff) = 1;
              s.WriteBack(At(s, kOff), 8);
              return 0;
            }), 0);
  ASSERT_EQ(OnHost(1, [](SimHost& s) {
              s.Invalidate(At(s, kOff), 8);
              return *At(s, kOff) == 1 ? 0 : 1;
            }), 0);
  ASSERT_EQ(OnHost(0, [](SimHost& s) {
              s.Invalidate(At(s, kOff), 8);
              *At(s, kOff) = 2;
              s.WriteBack(At(s, kOff), 8);
              return 0;
            }), 0);
  EXPECT_EQ(OnHost(1, [](SimHost& s) {
              if (*At(s, kOff) != 1) return 1;  // stale: host 1 did not invalidate
              s.Invalidate(At(s, kOff), 8);
              return *At(s, kOff) == 2 ? 0 : 2;
            }), 0);
  EXPECT_EQ(ReadSimCounters(path_).conflicts, 0u);  // every writer had observed the line
}

TEST_F(CoherenceSimTest, CrossHostAtomicLosesAnUpdateAndIsFlagged) {
  constexpr uint64_t kOff = 64 * 7;
  // Both hosts fetch_add a counter they invalidated first; host 0's line is
  // still dirty in its cache when host 1 writes its increment back.
  ASSERT_EQ(OnHost(0, [](SimHost& s) {
              s.Invalidate(At(s, kOff), 8);
              AtomicAt(s, kOff).fetch_add(1);
              return 0;
            }), 0);
  ASSERT_EQ(OnHost(1, [](SimHost& s) {
              s.Invalidate(At(s, kOff), 8);
              AtomicAt(s, kOff).fetch_add(1);
              s.WriteBack(At(s, kOff), 8);
              return 0;
            }), 0);
  EXPECT_EQ(PoolWord(kOff), 1u);
  ASSERT_EQ(OnHost(0, [](SimHost& s) {
              s.WriteBack(At(s, kOff), 8);  // an eviction, some time later
              return 0;
            }), 0);
  EXPECT_EQ(PoolWord(kOff), 1u) << "two increments, one survives";
  SimCounters c = ReadSimCounters(path_);
  EXPECT_EQ(c.conflicts, 1u);
  EXPECT_EQ(c.lost_updates, 1u);
  EXPECT_EQ(c.false_sharing, 0u);
}

TEST_F(CoherenceSimTest, CheckerFlagsTwoHostsWritingOneLine) {
  constexpr uint64_t kLine = 64 * 33;
  // Host 0 owns word 0 and host 1 word 1 of one line: false sharing.
  ASSERT_EQ(OnHost(0, [](SimHost& s) {
              *At(s, kLine) = 0xa;
              return 0;
            }), 0);
  ASSERT_EQ(OnHost(1, [](SimHost& s) {
              *At(s, kLine + 8) = 0xb;
              s.WriteBack(At(s, kLine), 64);
              return 0;
            }), 0);
  ASSERT_EQ(OnHost(0, [](SimHost& s) {
              s.WriteBack(At(s, kLine), 64);
              return 0;
            }), 0);
  EXPECT_EQ(PoolWord(kLine), 0xau);
  EXPECT_EQ(PoolWord(kLine + 8), 0u) << "host 1's word lost to host 0's whole-line write-back";
  SimCounters c = ReadSimCounters(path_);
  EXPECT_EQ(c.conflicts, 1u);
  EXPECT_EQ(c.false_sharing, 1u);

  // The same writes with a synchronisation point between them: no flag,
  // both words survive.
  constexpr uint64_t kOther = 64 * 34;
  ASSERT_EQ(OnHost(0, [](SimHost& s) {
              *At(s, kOther) = 0xa;
              s.WriteBack(At(s, kOther), 64);
              return 0;
            }), 0);
  ASSERT_EQ(OnHost(1, [](SimHost& s) {
              s.Invalidate(At(s, kOther), 64);
              *At(s, kOther + 8) = 0xb;
              s.WriteBack(At(s, kOther), 64);
              return 0;
            }), 0);
  EXPECT_EQ(PoolWord(kOther), 0xau);
  EXPECT_EQ(PoolWord(kOther + 8), 0xbu);
  EXPECT_EQ(ReadSimCounters(path_).conflicts, 1u);
}

TEST_F(CoherenceSimTest, ThreeHostsHandOffALineThroughInvalidates) {
  constexpr uint64_t kOff = 64 * 900;
  for (int round = 0; round < 6; ++round) {
    int host = round % 3;
    ASSERT_EQ(OnHost(host, [round](SimHost& s) {
                s.Invalidate(At(s, kOff), 8);
                if (*At(s, kOff) != uint64_t(round)) return 1;
                *At(s, kOff) = round + 1;
                s.WriteBack(At(s, kOff), 8);
                return 0;
              }), 0) << "round " << round;
  }
  EXPECT_EQ(PoolWord(kOff), 6u);
  EXPECT_EQ(ReadSimCounters(path_).conflicts, 0u);
}

TEST(ChurnScheduleTest, SeededAndReproducible) {
  ChurnSchedule a(42, 1, 0), b(42, 1, 0), other_seed(43, 1, 0), other_host(42, 2, 0), other_proc(42, 1, 1);
  int same = 0, diff_seed = 0, diff_host = 0, diff_proc = 0, hot = 0;
  for (int i = 0; i < 1000; ++i) {
    uint64_t x = a.Next(1 << 16, 1 << 8);
    same += x == b.Next(1 << 16, 1 << 8);
    diff_seed += x != other_seed.Next(1 << 16, 1 << 8);
    diff_host += x != other_host.Next(1 << 16, 1 << 8);
    diff_proc += x != other_proc.Next(1 << 16, 1 << 8);
    hot += x < (1 << 8);
    ASSERT_LT(x, 1u << 16);
  }
  EXPECT_EQ(same, 1000);
  EXPECT_GT(diff_seed, 900);
  EXPECT_GT(diff_host, 900);
  EXPECT_GT(diff_proc, 900);
  EXPECT_GT(hot, 300);  // half the picks from the hot window, a few more by chance
}

TEST_F(CoherenceSimTest, SpontaneousChurnIsSeededAndReproducible) {
  constexpr uint64_t kLines = 1024;
  auto run = [&](const char* seed) {
    setenv("MC_CXL_SIM_SEED", seed, 1);
    // A fresh pool and host each time: the same start, the same schedule.
    for (const std::string& f : SimFilePaths(path_, 1)) unlink(f.c_str());
    int fd = open(path_.c_str(), O_RDWR);
    EXPECT_EQ(ftruncate(fd, 0), 0);
    EXPECT_EQ(ftruncate(fd, off_t(kPoolBytes)), 0);
    close(fd);
    EXPECT_EQ(OnHost(0, [](SimHost& s) {
                s.SetHotBytes(kLines * 64);
                for (uint64_t l = 0; l < kLines; ++l) *At(s, l * 64) = l + 1;  // all dirty
                s.ChurnSteps(2000);
                return 0;
              }), 0);
    std::vector<bool> reached(kLines);
    for (uint64_t l = 0; l < kLines; ++l) reached[l] = PoolWord(l * 64) == l + 1;
    return reached;
  };
  std::vector<bool> first = run("1234"), again = run("1234"), other = run("99");
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  size_t n = std::count(first.begin(), first.end(), true);
  EXPECT_GT(n, 100u) << "evictions wrote dirty lines back without a WriteBack";
  EXPECT_LT(n, kLines) << "and left others in the host's cache";
}

TEST_F(CoherenceSimTest, ChurnThreadWritesBackOnItsOwn) {
  setenv("MC_CXL_SIM_CHURN", "2000000", 1);
  constexpr uint64_t kOff = 128;
  pid_t pid = Start(0, [](SimHost& s) {
    s.SetHotBytes(4096);
    *At(s, kOff) = 0x77;
    // Wait (bounded) until an eviction moved it: never a WriteBack here.
    bool moved = testutil::WaitUntil([&] { return s.write_backs() > 0; });
    return moved ? 0 : 1;
  });
  EXPECT_EQ(Wait(pid), 0);
  EXPECT_EQ(PoolWord(kOff), 0x77u);
}

TEST_F(CoherenceSimTest, LocalStoreInsideTheRefetchWindowSurvives) {
  constexpr uint64_t kLine = 64 * 600;
  ASSERT_EQ(OnHost(0, [](SimHost&) { return 0; }), 0);  // host 0's copy holds the line as it was
  // Host 1 changes word 1 of the line, so host 0's refetch brings new bytes.
  ASSERT_EQ(OnHost(1, [](SimHost& s) {
              *At(s, kLine + 8) = 0xb1;
              s.WriteBack(At(s, kLine), 64);
              return 0;
            }), 0);
  EXPECT_EQ(OnHost(0, [](SimHost& s) {
              // Another core of host 0 stores word 0 after the line was read
              // for the write-back, before the refetch.
              s.SetBeforeRefetchForTest([](void* base, uint64_t line) {
                std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(static_cast<char*>(base) + line * 64))
                    .store(0xa0, std::memory_order_relaxed);
              }, s.base());
              s.Invalidate(At(s, kLine), 64);
              s.SetBeforeRefetchForTest(nullptr, nullptr);
              if (*At(s, kLine) != 0xa0) return 1;      // the local store survived
              if (*At(s, kLine + 8) != 0xb1) return 2;  // the rest of the line was refetched
              s.WriteBack(At(s, kLine), 64);             // and it is dirty: written back now
              return 0;
            }), 0);
  EXPECT_EQ(PoolWord(kLine), 0xa0u);
  EXPECT_EQ(PoolWord(kLine + 8), 0xb1u);
  EXPECT_EQ(ReadSimCounters(path_).conflicts, 0u);
}

// Shared between the processes of one test (an anonymous MAP_SHARED page).
struct RaceFlags {
  std::atomic<int> started{0};
  std::atomic<int> stores_done{0};
  std::atomic<uint64_t> stores{0};
  std::atomic<uint64_t> invalidates{0};
  std::atomic<uint64_t> refetches{0};
};

TEST_F(CoherenceSimTest, ConcurrentLocalStoreSurvivesARefetch) {
  constexpr uint64_t kLine = 64 * 500;
  constexpr uint64_t kInvalidates = 100000;
  auto* flags = static_cast<RaceFlags*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(flags, MAP_FAILED);
  new (flags) RaceFlags();
  // Host 0, process A: increments word 0 of the line while the others run.
  pid_t storer = Start(0, [flags](SimHost& s) {
    if (!testutil::WaitUntil([&] { return flags->started.load() == 2; })) return 1;
    uint64_t n = 0;
    for (; n < 1000 || flags->invalidates.load(std::memory_order_relaxed) < kInvalidates; ++n) {
      AtomicAt(s, kLine).fetch_add(1, std::memory_order_relaxed);
    }
    flags->stores.store(n);
    flags->stores_done.store(1, std::memory_order_release);
    return 0;
  });
  // Host 0, process B: invalidates the line over and over: its refetches race the stores.
  pid_t invalidator = Start(0, [flags](SimHost& s) {
    flags->started.fetch_add(1);
    while (flags->stores_done.load(std::memory_order_acquire) == 0) {
      s.Invalidate(At(s, kLine), 64);
      flags->invalidates.fetch_add(1, std::memory_order_relaxed);
    }
    flags->refetches.store(s.fetches());
    return 0;
  });
  // A writer outside every simulated host (a device-side agent, as DMA is)
  // keeps changing word 1 of the line in the pool file itself, so each
  // refetch brings new bytes; word 0 in the pool is only ever host 0's.
  // (Another simulated host writing word 1 back would write its stale word 0
  // with it: false sharing, which loses host 0's increments by design.)
  pid_t other = fork();
  if (other == 0) {
    int fd = open(path_.c_str(), O_RDWR);
    void* m = mmap(nullptr, kPoolBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd < 0 || m == MAP_FAILED) _exit(1);
    std::atomic_ref<uint64_t> word1(*reinterpret_cast<uint64_t*>(static_cast<char*>(m) + kLine + 8));
    flags->started.fetch_add(1);
    for (uint64_t i = 1; flags->stores_done.load(std::memory_order_acquire) == 0; ++i) {
      word1.store(i, std::memory_order_relaxed);
      sched_yield();  // the storer and the invalidator need the cores
    }
    _exit(0);
  }
  EXPECT_EQ(Wait(storer), 0);
  EXPECT_EQ(Wait(invalidator), 0);
  EXPECT_EQ(Wait(other), 0);
  EXPECT_GT(flags->refetches.load(), 0u) << "no refetch brought host 1's bytes";
  // Every increment of host 0 is in host 0's copy: no refetch lost one.
  uint64_t stores = flags->stores.load();
  EXPECT_EQ(OnHost(0, [stores](SimHost& s) { return *At(s, kLine) == stores ? 0 : 1; }), 0);
  munmap(flags, 4096);
}

// The Pool on a simulated host (MC_CXL_SIM_HOST): the host copy is mapped,
// a coherent pool is refused, Format's and Verify's lines move by themselves.
TEST_F(CoherenceSimTest, PoolOnASimulatedHost) {
  std::string pool = dir_.File("formatted");
  auto on = [&](int host, const std::function<int(Pool&)>& fn) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("MC_CXL_SIM_HOST", std::to_string(host).c_str(), 1);
      auto p = Pool::Open(pool, 8ull << 20, true);
      if (!p.ok()) _exit(80);
      _exit(fn(**p));
    }
    return Wait(pid);
  };
  EXPECT_EQ(on(0, [](Pool& p) {
              FormatOptions coherent;
              if (p.Format(coherent).ok()) return 1;  // refused: a simulated host is not coherent
              FormatOptions nc;
              nc.coherence = CoherenceMode::kNonCoherent;
              if (!p.Format(nc).ok()) return 2;
              if (p.sim() == nullptr || p.base() != p.sim()->base()) return 3;
              SetCoherenceMode(CoherenceMode::kNonCoherent);
              if (GetLinePath() != LinePath::kSimulated) return 4;
              char* data = p.base() + p.geometry().data_offset;
              memcpy(data, "published", 10);
              PublishRange(data, 10);
              memcpy(data + 4096, "private", 8);  // never published
              return 0;
            }), 0);
  EXPECT_EQ(access((pool + ".simhost-0").c_str(), F_OK), 0);
  EXPECT_EQ(on(2, [](Pool& p) {
              if (!p.Verify(nullptr).ok()) return 1;  // Format wrote its tables back
              SetCoherenceMode(CoherenceMode::kNonCoherent);
              char* data = p.base() + p.geometry().data_offset;
              ObserveRange(data, 10);
              if (memcmp(data, "published", 10) != 0) return 2;
              ObserveRange(data + 4096, 8);
              return memcmp(data + 4096, "private", 8) != 0 ? 0 : 3;
            }), 0);
  for (const std::string& f : SimFilePaths(pool, 3)) unlink(f.c_str());
}

TEST(PublishBuildsTest, RealNonCoherentRunsOnOrdinaryMemory) {
  unsetenv("MC_CXL_SIM_HOST");
  std::vector<char> buf(1 << 16, 1);
  SetCoherenceMode(CoherenceMode::kNonCoherent);
  EXPECT_EQ(GetLinePath(), LinePath::kCacheLineOps);
  std::string insn = WriteBackInstruction();
  EXPECT_TRUE(insn == "clwb" || insn == "clflushopt" || insn == "clflush") << insn;
  buf[100] = 7;
  PublishRange(buf.data() + 3, buf.size() - 3);  // unaligned ends
  ObserveRange(buf.data() + 1, 200);
  EXPECT_EQ(buf[100], 7);
  SetCoherenceMode(CoherenceMode::kCoherent);
  EXPECT_EQ(GetLinePath(), LinePath::kFences);
}

}  // namespace
}  // namespace mcxl
