// DiskTier compaction and what runs beside it: relocations reported and the
// old segment deleted; a crash at each step of a compaction loses nothing
// live; random kills during appends, removes and compactions; a forked
// writer with concurrent reader processes; threads appending, removing,
// compacting and reading at once.
#include "mooncake_cxl/tier/disk_tier.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_cxl/common/log.h"
#include "test_util/disk_tier_fixture.h"

namespace mcxl::tier {
namespace {

using namespace testutil;

TEST_F(DiskTierTest, CompactionMovesLiveRecordsAndDeletesTheOldSegment) {
  Options o = Opts(512 * kKiB);
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  std::map<std::string, RecordLocation> live;
  for (int i = 0; i < 60; i++) {
    std::string k = Name("m", i);
    live[k] = Put(*t, k, 5, 30000 + i);
  }
  const uint32_t first_seg = live["m0"].segment_id;
  // Kill 3/4 of the first segment's records (overwrites and removes).
  int n = 0;
  for (auto& [k, l] : std::map(live)) {
    if (l.segment_id != first_seg) continue;
    if (n % 4 == 1) live[k] = Put(*t, k, 6, 1000);
    else if (n % 4 != 0) {
      ASSERT_TRUE(t->Remove(k, 5).ok());
      live.erase(k);
    }
    n++;
  }
  // One live record of the victim is corrupt: compaction drops it (reported
  // with segment 0) instead of copying bad bytes.
  std::string corrupt;
  for (auto& [k, l] : live)
    if (l.segment_id == first_seg && corrupt.empty()) corrupt = k;
  ASSERT_FALSE(corrupt.empty());
  FlipByte(SegmentPath(o.root_dir, first_seg), live[corrupt].offset + 64 + live[corrupt].key_len + 9);
  std::vector<std::string> relocated;
  bool dropped = false;
  uint64_t csum_before = GetReaderCounters().checksum_failures;
  t->SetRelocationCallback([&](std::string_view k, const RecordLocation& from, const RecordLocation& to) {
    ASSERT_EQ(live[std::string(k)], from);
    if (k == corrupt) {
      EXPECT_EQ(to.segment_id, 0u);
      dropped = true;
      live.erase(std::string(k));
      return;
    }
    EXPECT_NE(to.segment_id, 0u);
    EXPECT_NE(to.segment_id, from.segment_id);
    EXPECT_EQ(to.generation, from.generation);
    EXPECT_EQ(to.crc32c, from.crc32c);
    live[std::string(k)] = to;
    relocated.push_back(std::string(k));
  });
  uint64_t used = t->stats().used_bytes;
  // A small budget: several calls to finish one segment.
  for (int i = 0; i < 50 && t->stats().compactions == 0; i++) ASSERT_TRUE(t->Compact(40000).ok());
  EXPECT_EQ(t->stats().compactions, 1u);
  EXPECT_FALSE(fs::exists(SegmentPath(o.root_dir, first_seg)));
  EXPECT_GT(relocated.size(), 1u);
  EXPECT_TRUE(dropped);
  EXPECT_EQ(GetReaderCounters().checksum_failures, csum_before + 1);
  EXPECT_EQ(t->stats().relocations, relocated.size());
  EXPECT_LT(t->stats().used_bytes, used);
  EXPECT_EQ(Live(*t), live);
  for (auto& [k, l] : live) ASSERT_TRUE(ReadsBack(o.root_dir, k, l));
  t.reset();
  t = OpenTier(o);  // the removed keys stay removed after the rebuild
  EXPECT_EQ(Live(*t), live);
}

// A master killed at each step of compaction (after some copies, after the
// fdatasync, after the unlink) loses no live record, and rebuild never
// resurrects a removed one.
TEST_F(DiskTierTest, CrashDuringCompactionLosesNothing) {
  for (const char* point : {"compact.copied", "compact.synced", "compact.unlinked"}) {
    for (int after : {1, 3}) {
      if (std::string(point) != "compact.copied" && after > 1) continue;
      fs::remove_all(dir_ + "/tier");
      Options o = Opts(512 * kKiB);
      std::map<std::string, RecordLocation> live;
      {
        auto t = OpenTier(o);
        ASSERT_TRUE(t);
        for (int i = 0; i < 40; i++) {
          std::string k = Name("z", i);
          live[k] = Put(*t, k, 5, 30000 + i);
        }
        for (int i = 0; i < 40; i += 2) {
          std::string k = Name("z", i);
          ASSERT_TRUE(t->Remove(k, 5).ok());
          live.erase(k);
        }
      }
      pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        auto r = DiskTier::Open(o);
        if (!r.ok()) _exit(2);
        auto t = std::move(r).value();
        int hits = 0;
        std::string p = point;
        t->SetTestHook([&](const char* at) {
          if (p == at && ++hits >= after) raise(SIGKILL);
        });
        for (int i = 0; i < 10; i++) (void)t->Compact(0);
        _exit(3);  // the hook should have fired
      }
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFSIGNALED(status)) << point << " status " << status;
      auto t = OpenTier(o);
      ASSERT_TRUE(t);
      auto got = Live(*t);
      ASSERT_EQ(got.size(), live.size()) << point;
      for (auto& [k, l] : live) {
        ASSERT_TRUE(got.count(k)) << point << " lost " << k;
        EXPECT_TRUE(ReadsBack(o.root_dir, k, got[k])) << point;
      }
      // Finishing the compaction after the crash works too.
      for (int i = 0; i < 10; i++) ASSERT_TRUE(t->Compact(0).ok());
      for (auto& [k, l] : Live(*t)) EXPECT_TRUE(ReadsBack(o.root_dir, k, l));
      EXPECT_EQ(Live(*t).size(), live.size());
    }
  }
}

// SIGKILL at random moments of a mixed workload (appends of new generations,
// removes, compaction with small budgets): after each kill the rebuild has,
// for every key, the state of its last acknowledged operation (or of the one
// in flight), and every live record reads back intact. Several rounds reuse
// the same directory, so later rounds also recover from earlier crashes.
TEST_F(DiskTierTest, RandomKillsDuringAppendRemoveCompact) {
  constexpr int kKeys = 40, kMaxOps = 100000;
  struct Op {
    int32_t key;
    int32_t removed;  // 1 = remove, 0 = append
    uint64_t gen;
  };
  struct Shared {
    std::atomic<int> acked;   // ops[0, acked) are acknowledged (release by the child)
    std::atomic<int> intent;  // ops[intent - 1] may be in flight
    Op ops[kMaxOps];
  };
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* sh = new (mem) Shared{};
  Options o = Opts(256 * kKiB, 64 * kMiB);
  auto len_of = [](int key, uint64_t gen) { return uint64_t(((key * 131 + gen * 7) % 23) * 3001 + 1); };
  std::mt19937_64 rng(99);
  uint64_t gen_base = 1;
  // Expected: gen of the live record per key (0 = none) after the acked ops.
  std::map<int, uint64_t> state;
  for (int round = 0; round < 6; round++) {
    sh->acked.store(0);
    sh->intent.store(0);
    const uint64_t seed = rng();
    const uint64_t base = gen_base;
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto r = DiskTier::Open(o);
      if (!r.ok()) _exit(2);
      auto t = std::move(r).value();
      std::mt19937_64 crng(seed);
      uint64_t gen = base;
      for (int i = 0; i < kMaxOps;) {
        int key = int(crng() % kKeys);
        std::string k = Name("r", key);
        bool remove = crng() % 4 == 0;
        Op op{key, remove ? 1 : 0, remove ? (t->Lookup(k).ok() ? t->Lookup(k)->generation : 0) : gen++};
        if (remove && op.gen == 0) continue;
        sh->ops[i] = op;
        sh->intent.store(i + 1, std::memory_order_release);
        if (remove) {
          if (!t->Remove(k, op.gen).ok()) _exit(3);
        } else {
          auto v = ValueOf(k, op.gen, len_of(key, op.gen));
          if (!t->Append(k, v.data(), v.size(), op.gen).ok()) _exit(4);
        }
        sh->acked.store(++i, std::memory_order_release);
        if (crng() % 8 == 0 && !t->Compact(crng() % 100000).ok()) _exit(5);
      }
      _exit(0);
    }
    for (int w = 0; w < 20000 && sh->acked.load(std::memory_order_acquire) == 0; w++) usleep(1000);
    usleep(rng() % 100000);
    kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early: " << status;
    const int acked = sh->acked.load(std::memory_order_acquire);
    const int intent = sh->intent.load(std::memory_order_acquire);
    ASSERT_GT(acked, 0) << "round " << round;
    for (int i = 0; i < acked; i++) {
      const Op& op = sh->ops[i];
      state[op.key] = op.removed ? 0 : op.gen;
      gen_base = std::max(gen_base, op.gen + 1);
    }
    std::map<int, uint64_t> alt = state;  // the in-flight op may have landed
    if (intent > acked) {
      const Op& op = sh->ops[intent - 1];
      alt[op.key] = op.removed ? 0 : op.gen;
      gen_base = std::max(gen_base, op.gen + 1);
    }
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    std::map<int, uint64_t> got;
    for (auto& [k, l] : Live(*t)) {
      got[std::stoi(k.substr(1))] = l.generation;
      EXPECT_EQ(l.value_len, len_of(std::stoi(k.substr(1)), l.generation));
      ASSERT_TRUE(ReadsBack(o.root_dir, k, l)) << "round " << round;
    }
    auto strip = [](std::map<int, uint64_t> m) {
      for (auto it = m.begin(); it != m.end();) it = it->second == 0 ? m.erase(it) : std::next(it);
      return m;
    };
    ASSERT_TRUE(strip(got) == strip(state) || strip(got) == strip(alt))
        << "round " << round << ": acked " << acked << " intent " << intent;
    state = got;  // the next round starts from what is on disk
    gen_base = std::max(gen_base, t->MaxGeneration() + 1);
  }
  munmap(mem, sizeof(Shared));
}

// One forked writer appends while three reader processes read every record as
// soon as its location is published (records are immutable once returned).
TEST_F(DiskTierTest, WriterAndConcurrentReaderProcesses) {
  constexpr int kRecords = 300;
  struct Shared {
    std::atomic<int> published;  // release by the writer after locs[i], acquire by readers
    std::atomic<int> writer_done;
    RecordLocation locs[kRecords];
  };
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* sh = new (mem) Shared{};
  Options o = Opts(1 * kMiB, 256 * kMiB);
  pid_t writer = fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    auto r = DiskTier::Open(o);
    if (!r.ok()) _exit(2);
    auto t = std::move(r).value();
    for (int i = 0; i < kRecords; i++) {
      std::string k = Name("w", i);
      auto v = ValueOf(k, 9, 1000 + (i * 7919) % 200000);
      auto loc = t->Append(k, v.data(), v.size(), 9);
      if (!loc.ok()) _exit(3);
      sh->locs[i] = loc.value();
      sh->published.store(i + 1, std::memory_order_release);
    }
    sh->writer_done.store(1, std::memory_order_release);
    _exit(0);
  }
  std::vector<pid_t> readers;
  for (int r = 0; r < 3; r++) {
    pid_t p = fork();
    ASSERT_GE(p, 0);
    if (p == 0) {
      int next = 0, reads = 0;
      std::mt19937 rng(r);
      for (;;) {
        int n = sh->published.load(std::memory_order_acquire);
        bool done = sh->writer_done.load(std::memory_order_acquire) != 0;
        if (n == 0) {
          if (done) _exit(4);
          usleep(100);
          continue;
        }
        // The newest record and a random older one.
        for (int i : {n - 1, int(rng() % n)}) {
          RecordLocation l = sh->locs[i];
          std::string k = Name("w", i);
          std::vector<uint8_t> dst(l.value_len);
          if (!ReadRecord(o.root_dir, l, k, dst.data(), dst.size()).ok()) _exit(5);
          if (dst != ValueOf(k, 9, l.value_len)) _exit(6);
          reads++;
        }
        next = n;
        if (done && next == kRecords) break;
      }
      _exit(reads > 0 ? 0 : 7);
    }
    readers.push_back(p);
  }
  int status = 0;
  ASSERT_EQ(waitpid(writer, &status, 0), writer);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (pid_t p : readers) {
    ASSERT_EQ(waitpid(p, &status, 0), p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "reader status " << status;
  }
  auto t = OpenTier(o);
  EXPECT_EQ(Live(*t).size(), size_t(kRecords));
  munmap(mem, sizeof(Shared));
}

// Threads of one process at once: two writers (appends, upserts, removes), a
// compactor with a small budget, and a reader that looks keys up and reads
// them (a race with compaction may give FILE_NOT_FOUND/OBJECT_NOT_FOUND,
// never wrong bytes or a checksum failure). The index the relocation callback
// maintains matches the tier's, and a reopen sees the same.
TEST_F(DiskTierTest, ConcurrentThreadsAppendRemoveCompactRead) {
  Options o = Opts(256 * kKiB, 256 * kMiB);
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  std::mutex mu;
  std::map<std::string, RecordLocation> index;  // what a master would keep
  t->SetRelocationCallback([&](std::string_view k, const RecordLocation& from, const RecordLocation& to) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = index.find(std::string(k));
    if (it != index.end() && it->second == from) it->second = to;  // only if still current
  });
  std::atomic<bool> stop{false};  // relaxed is enough: a flag polled by loops
  std::atomic<uint64_t> gen{1};   // relaxed: unique numbers only
  const uint64_t csum_before = GetReaderCounters().checksum_failures;
  auto writer = [&](const char* prefix, int seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 400; i++) {
      std::string k = Name(prefix, long(rng() % 30));
      std::lock_guard<std::mutex> lock(mu);  // index and tier change together
      if (rng() % 4 == 0) {
        auto it = index.find(k);
        if (it == index.end()) continue;
        ASSERT_TRUE(t->Remove(k, it->second.generation).ok());
        index.erase(it);
      } else {
        uint64_t g = gen.fetch_add(1, std::memory_order_relaxed);
        index[k] = Put(*t, k, g, rng() % 50000 + 1);
      }
    }
  };
  std::thread w1(writer, "a", 1), w2(writer, "b", 2);
  std::thread compactor([&] {
    while (!stop.load(std::memory_order_relaxed)) ASSERT_TRUE(t->Compact(64 * kKiB).ok());
  });
  std::atomic<int> good_reads{0};
  std::thread reader([&] {
    std::mt19937 rng(3);
    while (!stop.load(std::memory_order_relaxed)) {
      std::string k = Name(rng() % 2 ? "a" : "b", long(rng() % 30));
      auto l = t->Lookup(k);
      if (!l.ok()) continue;
      std::vector<uint8_t> dst(l->value_len);
      Status s = ReadRecord(o.root_dir, *l, k, dst.data(), dst.size());
      if (s.ok()) {
        ASSERT_EQ(dst, ValueOf(k, l->generation, l->value_len));
        good_reads++;
      } else {
        ASSERT_TRUE(s.error() == ErrorCode::FILE_NOT_FOUND ||
                    s.error() == ErrorCode::OBJECT_NOT_FOUND)
            << ErrorCodeName(s.error());
      }
    }
  });
  w1.join();
  w2.join();
  stop.store(true, std::memory_order_relaxed);
  compactor.join();
  reader.join();
  EXPECT_GT(good_reads.load(), 0);
  EXPECT_EQ(GetReaderCounters().checksum_failures, csum_before);
  for (int i = 0; i < 100; i++) ASSERT_TRUE(t->Compact(0).ok());
  EXPECT_GT(t->stats().compactions, 0u);
  EXPECT_EQ(Live(*t), index);
  for (auto& [k, l] : index) ASSERT_TRUE(ReadsBack(o.root_dir, k, l));
  t.reset();
  t = OpenTier(o);
  EXPECT_EQ(Live(*t), index);
}

}  // namespace
}  // namespace mcxl::tier
