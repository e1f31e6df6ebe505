// DiskTier against an unlucky operator and a hostile host: a damaged block
// where a tombstone was never brings a removed or older value back (the
// records it may hide are dropped, durably, even when the block was the last
// or compaction copied older records after it); the files get the configured
// mode whatever the umask and a directory others may enter is refused; a
// second opener (thread or process) is refused and told who holds the
// directory; the capacity follows the filesystem's free space down and up.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "test_util/disk_tier_fixture.h"

namespace mcxl::tier {
namespace {

using namespace testutil;

uint32_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Bytes of a tombstone block worth flipping: magic, kind, generation, the
// header crc, a key byte.
constexpr uint64_t kFlipOffsets[] = {1, 6, 40, 61, 65};

// Remove (a tombstone) and "upsert" (the old record tombstoned) of
// disk-resident keys, one bit of each tombstone block flipped: neither
// comes back, whether or not a fresh record follows the damaged blocks, and
// not after a second reopen or a compaction either.
TEST_F(DiskTierTest, DamagedTombstoneNeverResurrects) {
  for (bool later : {false, true}) {
    for (uint64_t flip : kFlipOffsets) {
      SCOPED_TRACE(std::string(later ? "a record after, " : "tombstones last, ") + "flip at " + std::to_string(flip));
      fs::remove_all(dir_ + "/tier");
      Options o = Opts(1 * kMiB);
      RecordLocation ta{}, tb{};
      {
        auto t = OpenTier(o);
        ASSERT_TRUE(t);
        Put(*t, "removed", 1, 5000);
        Put(*t, "upserted", 1, 5000);
        Put(*t, "other", 1, 5000);
        ASSERT_TRUE(t->Remove("removed", 1).ok());
        ASSERT_TRUE(t->Remove("upserted", 1).ok());  // its new value lives in the pool only
        if (later) Put(*t, "later", 2, 5000);
        // Where the tombstones are: right after the three values.
        auto live = Live(*t);
        ASSERT_EQ(live.count("removed"), 0u);
        ta.segment_id = tb.segment_id = live["other"].segment_id;
        ta.offset = live["other"].offset + 2 * kBlockSize;  // 64 + 5 + 5000 bytes
        tb.offset = ta.offset + kBlockSize;
      }
      const std::string seg = SegmentPath(o.root_dir, ta.segment_id);
      FlipByte(seg, ta.offset + flip);
      FlipByte(seg, tb.offset + flip);
      for (int round = 0; round < 3; ++round) {
        auto t = OpenTier(o);
        ASSERT_TRUE(t);
        auto live = Live(*t);
        EXPECT_EQ(live.count("removed"), 0u) << "round " << round;
        EXPECT_EQ(live.count("upserted"), 0u) << "round " << round;
        EXPECT_EQ(live.count("other"), 0u) << "written before a damaged block: dropped";
        if (later) {
          EXPECT_EQ(live.count("later"), 1u) << "written after the damaged blocks: kept";
        }
        if (round == 0) {
          EXPECT_EQ(t->stats().damage_dropped, 3u);
        }
        if (round == 1) {
          for (int i = 0; i < 8; i++) ASSERT_TRUE(t->Compact(0).ok());
        }
      }
    }
  }
}

// Compaction copies keep their original seq: they must not bound a damaged
// block. Segment 1 holds c (live) with garbage; v is written and removed
// (its tombstone t in segment 3); compaction copies c after t; t is damaged.
TEST_F(DiskTierTest, CompactionCopyAfterDamagedTombstoneDoesNotBoundIt) {
  Options o = Opts(4 * kBlockSize);
  {
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    Put(*t, "c", 1, 100);
    Put(*t, "d", 1, 100);
    Put(*t, "e", 1, 100);  // segment 1 full
    ASSERT_TRUE(t->Remove("d", 1).ok());
    ASSERT_TRUE(t->Remove("e", 1).ok());
    RecordLocation v = Put(*t, "v", 1, 100);
    ASSERT_TRUE(t->Remove("v", 1).ok());
    const uint32_t tomb_seg = v.segment_id + 1;
    ASSERT_TRUE(t->Compact(0).ok());
    auto live = Live(*t);
    ASSERT_EQ(live.count("c"), 1u);
    ASSERT_EQ(live["c"].segment_id, tomb_seg) << "c was copied next to v's tombstone";
    ASSERT_EQ(live["c"].offset, 2 * kBlockSize) << "right after it";
    FlipByte(SegmentPath(o.root_dir, tomb_seg), kBlockSize + 40);
  }
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  auto live = Live(*t);
  EXPECT_EQ(live.count("v"), 0u) << "the removed value came back";
  EXPECT_EQ(live.count("c"), 0u) << "written before the damaged block";
}

TEST_F(DiskTierTest, FileModesFollowOptionsWhateverTheUmask) {
  const mode_t old = umask(022);
  Options o = Opts(64 * kKiB);
  {
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    Put(*t, "k", 1, 100000);  // several segments
    EXPECT_EQ(ModeOf(o.root_dir), 0700u);
    EXPECT_EQ(ModeOf(o.root_dir + "/lock.mcxl"), 0600u);
    for (auto& f : SegmentFiles(o.root_dir)) EXPECT_EQ(ModeOf(f), 0600u) << f;
    if (fs::exists(o.root_dir + "/reserve.mcxl")) {
      EXPECT_EQ(ModeOf(o.root_dir + "/reserve.mcxl"), 0600u);
    }
  }
  // A segment an older version left world-readable is fixed at open.
  const std::string seg = SegmentFiles(o.root_dir).front();
  ASSERT_EQ(chmod(seg.c_str(), 0644), 0);
  { ASSERT_TRUE(OpenTier(o)); }
  EXPECT_EQ(ModeOf(seg), 0600u);
  // A directory others may enter is refused (unless allowed).
  ASSERT_EQ(chmod(o.root_dir.c_str(), 0755), 0);
  EXPECT_EQ(DiskTier::Open(o).error(), ErrorCode::INVALID_PARAMS);
  Options allowed = o;
  allowed.allow_world_readable = true;
  EXPECT_TRUE(DiskTier::Open(allowed).ok());
  // The group's mode (--pool_group): 0660 files in a 0770 directory.
  Options g = Opts(64 * kKiB);
  g.root_dir = dir_ + "/grouped";
  g.file_mode = 0660;
  g.group = int64_t(getgid());
  {
    auto t = OpenTier(g);
    ASSERT_TRUE(t);
    Put(*t, "k", 1, 1000);
  }
  EXPECT_EQ(ModeOf(g.root_dir), 0770u);
  for (auto& f : SegmentFiles(g.root_dir)) EXPECT_EQ(ModeOf(f), 0660u) << f;
  umask(old);
}

// One DiskTier per directory: a second opener in this process and one in
// another process are refused with the holder named; after the holder
// closes, the directory opens again.
TEST_F(DiskTierTest, SecondOpenerIsRefused) {
  Options o = Opts();
  o.owner = "pool-uuid-of-the-first";
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  Options second = o;
  second.owner = "pool-uuid-of-the-second";
  EXPECT_EQ(DiskTier::Open(second).error(), ErrorCode::FILE_OPEN_FAIL);
  std::ifstream lock(o.root_dir + "/lock.mcxl");
  std::stringstream holder;
  holder << lock.rdbuf();
  EXPECT_NE(holder.str().find("pool pool-uuid-of-the-first"), std::string::npos) << holder.str();
  EXPECT_NE(holder.str().find("pid " + std::to_string(getpid())), std::string::npos) << holder.str();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(DiskTier::Open(second).ok() ? 0 : 3);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << "another process opened a held directory";
  t.reset();
  pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(DiskTier::Open(second).ok() ? 0 : 3);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the lock outlived its holder";
}

// On an 8 MiB tmpfs with a 1 GiB capacity: the tier caps itself below the
// filesystem (no ENOSPC of its own), shrinks when another file takes the
// space, meets ENOSPC (counted, the active segment sealed) when the space
// goes between two refreshes, and grows back when the space returns.
TEST_F(DiskTierTest, CapacityFollowsTheFilesystem) {
  const std::string mnt = dir_ + "/small";
  fs::create_directories(mnt);
  if (geteuid() != 0 || mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=8m") != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here";
  struct Unmount {
    std::string p;
    ~Unmount() { umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  Options o = Opts(256 * kMiB, 1024 * kMiB);
  o.root_dir = mnt + "/tier";
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  Stats s = t->stats();
  EXPECT_LT(s.capacity_effective, 8 * kMiB);
  EXPECT_GT(s.capacity_effective, 4 * kMiB);
  std::vector<std::pair<std::string, RecordLocation>> recs;
  EXPECT_EQ(FillUntilFull(*t, "a", 1000, 60000, &recs), ErrorCode::NO_AVAILABLE_HANDLE);
  s = t->stats();
  EXPECT_EQ(s.enospc, 0u) << "the cap keeps the tier below the filesystem";
  EXPECT_GT(s.segments, 3u) << "segments sized from the filesystem, not the capacity";
  // Free half of it: tombstones and compaction give the space back.
  for (size_t i = 0; i < recs.size(); i += 2) ASSERT_TRUE(t->Remove(recs[i].first, 1).ok());
  for (int i = 0; i < 20; i++) (void)t->Compact(0);
  t->RefreshSpace();
  // Another program takes the free space without the tier refreshing: ENOSPC.
  const std::string filler = mnt + "/filler";
  {
    int fd = open(filler.c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    std::vector<char> mb(kMiB, 'x');
    while (write(fd, mb.data(), mb.size()) > 0) {
    }
    std::vector<char> kb(4096, 'x');
    while (write(fd, kb.data(), kb.size()) > 0) {
    }
    close(fd);
  }
  auto v = ValueOf("b", 1, 60000);
  ErrorCode e = ErrorCode::OK;
  for (int i = 0; i < 200 && e == ErrorCode::OK; i++) {
    auto r = t->Append(Name("b", i), v.data(), v.size(), 1);
    e = r.ok() ? ErrorCode::OK : r.error();
  }
  EXPECT_EQ(e, ErrorCode::NO_AVAILABLE_HANDLE);
  s = t->stats();
  EXPECT_GE(s.enospc, 1u);
  EXPECT_GE(s.write_errors, s.enospc);
  EXPECT_LE(s.capacity_effective, s.used_bytes + 64 * kKiB) << "capped at what it holds";
  // Space returns: appends work again after a refresh.
  ASSERT_EQ(unlink(filler.c_str()), 0);
  t->RefreshSpace();
  EXPECT_GT(t->stats().capacity_effective, t->stats().used_bytes + kMiB);
  RecordLocation n = Put(*t, "again", 1, 60000);
  EXPECT_TRUE(ReadsBack(o.root_dir, "again", n));
  for (size_t i = 1; i < recs.size(); i += 2) {  // where compaction put them
    auto l = t->Lookup(recs[i].first);
    ASSERT_TRUE(l.ok()) << recs[i].first;
    EXPECT_TRUE(ReadsBack(o.root_dir, recs[i].first, l.value()));
  }
}

}  // namespace
}  // namespace mcxl::tier
