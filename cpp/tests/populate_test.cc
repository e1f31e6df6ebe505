// The background population of populate.h: what it allocates and maps,
// that it never grows a file that shrank, and that Stop ends it.
#include "mooncake_cxl/pool/populate.h"

#include <sys/mman.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <string>

#include "test_util/deadline.h"
#include "test_util/shm_dir.h"

namespace mcxl {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

uint64_t AllocatedBytes(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? uint64_t(st.st_blocks) * 512 : 0;
}

// Bytes of `path`'s mapping resident in this process (smaps Rss).
// A populated 64 MiB mapping's Rss: all of it but a few pages, which the
// kernel's page migration (compaction) unmaps for a moment on a busy
// machine (seen: 2 pages short once in ~15 runs); an unpopulated one is
// short by megabytes.
constexpr uint64_t kWholePoolResident = (64 << 20) - (64 << 10);

uint64_t ResidentBytes(const std::string& path) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  uint64_t kb = 0;
  while (std::getline(smaps, line)) {
    std::istringstream in(line);
    std::string first;
    in >> first;
    if (first.find('-') != std::string::npos && first.back() != ':') {
      std::string perms, off, dev, inode, name;
      in >> perms >> off >> dev >> inode >> name;
      inside = name == path;
    } else if (inside && first == "Rss:") {
      uint64_t v = 0;
      in >> v;
      kb += v;
    }
  }
  return kb * 1024;
}

std::unique_ptr<Pool> Formatted(const std::string& path, uint64_t size) {
  auto p = Pool::Open(path, size, true);
  EXPECT_TRUE(p.ok());
  if (!p.ok()) return nullptr;
  EXPECT_TRUE((*p)->Format(FormatOptions{}).ok());
  return std::move(p.value());
}

// A formatted 64 MiB pool at `path` with none of its pages mapped here.
std::unique_ptr<Pool> Unmapped(const std::string& path) {
  auto pool = Formatted(path, 64 * kMiB);
  if (pool && madvise(pool->base(), pool->size(), MADV_DONTNEED) != 0) return nullptr;
  return pool;
}

void WaitDone(const BackgroundPopulator& pop) {
  ASSERT_TRUE(testutil::WaitUntil([&] { return pop.done(); })) << "population not done";
}

TEST(Populate, PlanIsMetadataThenDataOnTmpfs) {
  testutil::ShmDir dir("populate_plan");
  auto pool = Formatted(dir.File("p"), 64 * kMiB);
  ASSERT_TRUE(pool);
  EXPECT_TRUE(PopulateDataPays(*pool));
  auto plan = PopulatePlan(*pool, true);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].offset, 0u);
  EXPECT_EQ(plan[0].len, pool->geometry().data_offset);
  EXPECT_EQ(plan[1].offset + plan[1].len, pool->size());
  EXPECT_EQ(PopulatePlan(*pool, false).size(), 1u);
}

TEST(Populate, AllocateFillsTheFileAndMapsItAndMapMapsIt) {
  testutil::ShmDir dir("populate_fill");
  std::string path = dir.File("p");
  auto pool = Formatted(path, 64 * kMiB);
  ASSERT_TRUE(pool);
  pool->base()[pool->size() - 1] = 7;  // a byte written before must survive
  EXPECT_LT(AllocatedBytes(path), 32 * kMiB);
  BackgroundPopulator master_side;
  master_side.Start(pool.get(), PopulatePlan(*pool, true), "test", PopulateMode::kAllocate);
  WaitDone(master_side);
  EXPECT_GE(AllocatedBytes(path), 64 * kMiB);
  EXPECT_GE(ResidentBytes(path), kWholePoolResident);  // the master's header writes take no fault
  ASSERT_EQ(madvise(pool->base(), pool->size(), MADV_DONTNEED), 0);  // as a fresh client's mapping
  EXPECT_LT(ResidentBytes(path), 32 * kMiB);
  BackgroundPopulator client_side;
  client_side.Start(pool.get(), PopulatePlan(*pool, true), "test", PopulateMode::kMap);
  WaitDone(client_side);
  EXPECT_GE(ResidentBytes(path), kWholePoolResident);
  EXPECT_EQ(pool->base()[pool->size() - 1], 7);
  EXPECT_TRUE(pool->Verify(nullptr).ok());
}

TEST(Populate, NeverGrowsAFileThatShrank) {
  testutil::ShmDir dir("populate_shrunk");
  std::string path = dir.File("p");
  auto pool = Formatted(path, 64 * kMiB);
  ASSERT_TRUE(pool);
  ASSERT_EQ(truncate(path.c_str(), 8 * kMiB), 0);
  EXPECT_EQ(AllocateRange(*pool, 16 * kMiB, 2 * kMiB).error(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  BackgroundPopulator pop;
  pop.Start(pool.get(), {{16 * kMiB, 48 * kMiB}}, "test", PopulateMode::kAllocate);
  pop.Stop();
  EXPECT_FALSE(pop.done());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(uint64_t(st.st_size), 8 * kMiB);
  EXPECT_EQ(pool->DeviceSize(), 8 * kMiB);
}

TEST(Populate, StopEndsARunAndCanRestart) {
  testutil::ShmDir dir("populate_stop");
  auto pool = Formatted(dir.File("p"), 64 * kMiB);
  ASSERT_TRUE(pool);
  BackgroundPopulator pop;
  pop.Start(pool.get(), PopulatePlan(*pool, true), "test", PopulateMode::kMap);
  pop.Stop();
  pop.Stop();  // idempotent
  pop.Start(pool.get(), PopulatePlan(*pool, true), "test", PopulateMode::kMap);
  WaitDone(pop);
}

// While the probe says foreground work ran, no step is taken (not a byte
// allocated or mapped); once it goes quiet the run finishes. Stop ends a
// run that waits on a busy probe.
TEST(Populate, DefersEveryStepWhileTheForegroundIsBusy) {
  testutil::ShmDir dir("populate_defer");
  std::string path = dir.File("p");
  auto pool = Unmapped(path);
  ASSERT_TRUE(pool);
  uint64_t allocated = AllocatedBytes(path), resident = ResidentBytes(path);
  std::atomic<bool> busy{true};
  std::atomic<int> asked{0};
  BackgroundPopulator pop;
  pop.Start(pool.get(), PopulatePlan(*pool, true), "test", PopulateMode::kAllocate, [&] {
    asked.fetch_add(1);
    return busy.load();
  });
  ASSERT_TRUE(testutil::WaitUntil([&] { return asked.load() >= 5; }));
  EXPECT_FALSE(pop.done());
  EXPECT_EQ(AllocatedBytes(path), allocated);
  EXPECT_LE(ResidentBytes(path), resident);
  busy = false;
  WaitDone(pop);
  EXPECT_GE(AllocatedBytes(path), 64 * kMiB);
  EXPECT_GE(ResidentBytes(path), kWholePoolResident);

  BackgroundPopulator waiting;
  waiting.Start(pool.get(), PopulatePlan(*pool, true), "test", PopulateMode::kMap, [] { return true; });
  waiting.Stop();
  EXPECT_FALSE(waiting.done());
}

// Busy with a frontier: only the steps just past it are mapped (none the
// frontier passed, nor the metadata), following it as it moves; once quiet
// the skipped ranges are filled in and the run is done.
TEST(Populate, LeadsTheFrontierWhileBusyAndFillsInTheRestWhenQuiet) {
  testutil::ShmDir dir("populate_lead");
  std::string path = dir.File("p");
  auto pool = Unmapped(path);
  ASSERT_TRUE(pool);
  const uint64_t before = ResidentBytes(path);
  const uint64_t data = pool->geometry().data_offset;
  // seq_cst (the default): test bookkeeping.
  std::atomic<bool> busy{true};
  std::atomic<uint64_t> frontier{data + 16 * kMiB + 4096}, asked{0};
  BackgroundPopulator pop;
  pop.Start(pool.get(), PopulatePlan(*pool, true), "test", PopulateMode::kMap, [&] {
    asked.fetch_add(1);
    return busy.load();
  }, [&] { return frontier.load(); });
  const uint64_t lead_bound = kLeadBytes + 2 * kMapStepBytes;  // the step holding the frontier, and one past
  ASSERT_TRUE(testutil::WaitUntil([&] { return ResidentBytes(path) >= before + kLeadBytes; }));
  uint64_t polls = asked.load();
  ASSERT_TRUE(testutil::WaitUntil([&] { return asked.load() >= polls + 5; }));  // it waits, busy
  EXPECT_FALSE(pop.done());
  EXPECT_LE(ResidentBytes(path), before + lead_bound);
  frontier = data + 40 * kMiB;
  ASSERT_TRUE(testutil::WaitUntil([&] { return ResidentBytes(path) >= before + 2 * kLeadBytes; }));
  polls = asked.load();
  ASSERT_TRUE(testutil::WaitUntil([&] { return asked.load() >= polls + 5; }));
  EXPECT_FALSE(pop.done());
  EXPECT_LE(ResidentBytes(path), before + 2 * lead_bound);
  busy = false;
  WaitDone(pop);
  EXPECT_GE(ResidentBytes(path), kWholePoolResident);
}

// The probe from a counter: busy exactly when the counter moved since the
// previous call.
TEST(Populate, BusySinceLastPollFollowsTheCounter) {
  ActivityCounter c;
  ForegroundBusy busy = BusySinceLastPoll(&c);
  EXPECT_FALSE(busy());  // never moved
  c.Note();
  EXPECT_TRUE(busy());
  EXPECT_FALSE(busy());
  c.Note();
  c.Note();
  EXPECT_TRUE(busy());
  EXPECT_FALSE(busy());
}

}  // namespace
}  // namespace mcxl
