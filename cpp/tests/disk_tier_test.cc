// DiskTier (SSD tier segment files): crc32c vectors; round trip across
// segments; rebuild from the files alone (newest generation wins, tombstones
// hide older records); bad arguments; a torn tail at any byte and a corrupt
// header mid-segment; flipped bytes give CHECKSUM_MISMATCH and a counter,
// never bytes; capacity full; O_DIRECT on ext4 and the tmpfs fallback;
// large records through io_uring; a full filesystem. Compaction and crashes:
// disk_tier_compaction_test.cc; batched writes: disk_tier_batch_test.cc.
#include "mooncake_cxl/tier/disk_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_cxl/common/log.h"
#include "test_util/disk_tier_fixture.h"

namespace mcxl::tier {
namespace {

using namespace testutil;

TEST(Crc32cTest, KnownVectorsAndChaining) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  std::string s = "The quick brown fox jumps over the lazy dog, many times over";
  uint32_t a = Crc32c(s.data(), 17);
  EXPECT_EQ(Crc32c(s.data() + 17, s.size() - 17, a), Crc32c(s.data(), s.size()));
}

TEST_F(DiskTierTest, RoundTripAcrossSegmentsAndReopen) {
  Options o = Opts(1 * kMiB);
  std::map<std::string, RecordLocation> locs;
  std::mt19937_64 rng(1);
  {
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    for (int i = 0; i < 120; i++) {
      std::string key = Name("key-", i);
      uint64_t len = (i % 10 == 0) ? 0 : rng() % (300 * kKiB);
      if (i == 7) len = 3 * kMiB;  // larger than a segment: a segment of its own
      locs[key] = Put(*t, key, 100 + i, len);
    }
    std::string long_key(5000, 'k');  // key longer than one block
    locs[long_key] = Put(*t, long_key, 1000, 777);
    for (auto& [k, l] : locs) ASSERT_TRUE(ReadsBack(o.root_dir, k, l));
    Stats s = t->stats();
    EXPECT_EQ(s.objects, locs.size());
    EXPECT_GT(s.segments, 5u);
    EXPECT_EQ(s.appends, locs.size());
    EXPECT_EQ(Live(*t), locs);
    EXPECT_EQ(t->MaxGeneration(), 1000u);
  }
  auto t = OpenTier(o);  // rebuild from the files alone
  ASSERT_TRUE(t);
  auto live = Live(*t);
  EXPECT_EQ(live, locs);
  EXPECT_EQ(t->MaxGeneration(), 1000u);
  for (auto& [k, l] : live) ASSERT_TRUE(ReadsBack(o.root_dir, k, l));
  // Appends after a reopen go on (a fresh segment) and survive another reopen.
  locs["after"] = Put(*t, "after", 2000, 5000);
  t.reset();
  t = OpenTier(o);
  EXPECT_EQ(Live(*t), locs);
}

TEST_F(DiskTierTest, RebuildNewestGenerationAndTombstones) {
  Options o = Opts(256 * kKiB);
  std::map<std::string, RecordLocation> expect;
  {
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    for (int i = 0; i < 20; i++) {
      std::string k = Name("k", i);
      Put(*t, k, 10, 20000);
      expect[k] = Put(*t, k, 20, 30000);  // newer generation of the same key
    }
    // Same generation appended again (re-offload): the later copy wins.
    expect["k0"] = Put(*t, "k0", 20, 30000);
    for (int i = 0; i < 20; i += 2) {
      std::string k = Name("k", i);
      ASSERT_TRUE(t->Remove(k, 20).ok());
      expect.erase(k);
    }
    EXPECT_TRUE(t->Remove("k1", 19).ok());  // older than the live record: no effect
    EXPECT_TRUE(t->Remove("nope", 5).ok());
    // A stale generation is refused; a removed key's generation too.
    auto v = ValueOf("k1", 5, 10);
    EXPECT_EQ(t->Append("k1", v.data(), 10, 5).error(), ErrorCode::INVALID_VERSION);
    EXPECT_EQ(t->Append("k2", v.data(), 10, 20).error(), ErrorCode::INVALID_VERSION);
    expect["k2"] = Put(*t, "k2", 30, 1234);  // re-put after remove
    EXPECT_EQ(Live(*t), expect);
    EXPECT_EQ(t->Lookup("k4").error(), ErrorCode::OBJECT_NOT_FOUND);
  }
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  EXPECT_EQ(Live(*t), expect);
  EXPECT_EQ(t->MaxGeneration(), 30u);
  for (auto& [k, l] : expect) EXPECT_TRUE(ReadsBack(o.root_dir, k, l));
}

TEST_F(DiskTierTest, BadArguments) {
  auto t = OpenTier(Opts());
  ASSERT_TRUE(t);
  char b[8] = {};
  EXPECT_EQ(t->Append("", b, 8, 1).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(t->Append(std::string(70000, 'x'), b, 8, 1).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(t->Append("k", nullptr, 8, 1).error(), ErrorCode::INVALID_PARAMS);
  RecordLocation loc = Put(*t, "k", 1, 100);
  std::vector<uint8_t> dst(100);
  EXPECT_EQ(ReadRecord(t->root_dir(), loc, "k", dst.data(), 99).error(), ErrorCode::BUFFER_OVERFLOW);
  EXPECT_EQ(ReadRecord(t->root_dir(), loc, "j", dst.data(), 100).error(), ErrorCode::OBJECT_NOT_FOUND);
  RecordLocation bad = loc;
  bad.offset += 1;
  EXPECT_EQ(ReadRecord(t->root_dir(), bad, "k", dst.data(), 100).error(), ErrorCode::INVALID_PARAMS);
  bad = loc;
  bad.offset = 1ull << 40;  // past the end of the file
  EXPECT_EQ(ReadRecord(t->root_dir(), bad, "k", dst.data(), 100).error(),
            ErrorCode::CHECKSUM_MISMATCH);
  bad = loc;
  bad.generation = 2;
  EXPECT_EQ(ReadRecord(t->root_dir(), bad, "k", dst.data(), 100).error(), ErrorCode::OBJECT_NOT_FOUND);
  bad = loc;
  bad.value_len = 1ull << 50;
  EXPECT_EQ(ReadRecord(t->root_dir(), bad, "k", dst.data(), 100).error(), ErrorCode::INVALID_PARAMS);
  bad = loc;
  bad.segment_id = 99;
  EXPECT_EQ(ReadRecord(t->root_dir(), bad, "k", dst.data(), 100).error(), ErrorCode::FILE_NOT_FOUND);
  EXPECT_TRUE(ReadsBack(t->root_dir(), "k", loc));
}

// A crash can tear the last record at any byte: truncate the active segment at
// random offsets (and at each block edge); rebuild keeps every record that
// ended before the cut and nothing after it.
TEST_F(DiskTierTest, TornTailAtAnyByteKeepsEarlierRecords) {
  Options o = Opts(64 * kMiB);
  std::vector<std::pair<std::string, RecordLocation>> recs;
  {
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    std::mt19937_64 rng(7);
    for (int i = 0; i < 24; i++) {
      std::string k = Name("t", i);
      recs.emplace_back(k, Put(*t, k, i + 1, rng() % (40 * kKiB) + (i % 3 == 0 ? 9000 : 10)));
    }
  }
  auto files = SegmentFiles(o.root_dir);
  ASSERT_EQ(files.size(), 1u);
  const uint64_t size = fs::file_size(files[0]);
  std::mt19937_64 rng(11);
  std::vector<uint64_t> cuts = {0, 1, 63, 4095, 4096, 4097, 4096 + 63, 4096 + 64, size - 1};
  for (int i = 0; i < 40; i++) cuts.push_back(rng() % size);
  const std::string copy = dir_ + "/copy";
  for (uint64_t cut : cuts) {
    CopyDir(o.root_dir, copy);
    const std::string seg = SegmentPath(copy, recs[0].second.segment_id);
    ASSERT_EQ(truncate(seg.c_str(), off_t(cut)), 0);
    Options oc = o;
    oc.root_dir = copy;
    auto t = OpenTier(oc);
    ASSERT_TRUE(t);
    auto live = Live(*t);
    for (auto& [k, l] : recs) {
      uint64_t end = l.offset + 64 + l.key_len + l.value_len;
      if (end <= cut) {
        ASSERT_TRUE(live.count(k)) << "cut " << cut << " lost " << k;
        EXPECT_EQ(live[k], l);
        EXPECT_TRUE(ReadsBack(copy, k, l));
      } else {
        EXPECT_FALSE(live.count(k)) << "cut " << cut << " kept torn " << k;
      }
    }
    // The tier keeps working after a torn tail.
    RecordLocation n = Put(*t, "new", 1000, 5000);
    EXPECT_TRUE(ReadsBack(copy, "new", n));
  }
}

// A record whose header never reached the file (body written, crash before
// block 0) is not rebuilt; a corrupt header mid-segment may have been a
// tombstone, so the records written before it are dropped, those after stay.
TEST_F(DiskTierTest, CrashBeforeHeaderAndCorruptHeaderMidSegment) {
  Options o = Opts(64 * kMiB);
  std::vector<std::pair<std::string, RecordLocation>> recs;
  {
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    for (int i = 0; i < 6; i++) {
      std::string k = Name("c", i);
      recs.emplace_back(k, Put(*t, k, i + 1, 20000 + i));
    }
  }
  // Zero block 0 of record 2 (as if its header write never happened) and flip a
  // header byte of record 4.
  const std::string seg = SegmentPath(o.root_dir, recs[0].second.segment_id);
  int fd = open(seg.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> zero(4096, 0);
  ASSERT_EQ(pwrite(fd, zero.data(), 4096, off_t(recs[2].second.offset)), 4096);
  close(fd);
  FlipByte(seg, recs[4].second.offset + 20);
  // The last record: a newer generation of c0 whose value write was torn
  // (header there, value bytes not): rebuild verifies a tail record's value,
  // so c0's older generation stays the live one.
  {
    auto t = OpenTier(o);
    RecordLocation torn = Put(*t, "c0", 50, 30000);
    t.reset();
    const std::string seg2 = SegmentPath(o.root_dir, torn.segment_id);
    int fd2 = open(seg2.c_str(), O_RDWR);
    ASSERT_GE(fd2, 0);
    ASSERT_EQ(pwrite(fd2, zero.data(), 4096, off_t(torn.offset + 8192)), 4096);
    close(fd2);
  }
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  auto live = Live(*t);
  EXPECT_EQ(live.size(), 1u);
  ASSERT_TRUE(live.count(recs[5].first));
  EXPECT_EQ(live[recs[5].first], recs[5].second);
  EXPECT_TRUE(ReadsBack(o.root_dir, recs[5].first, recs[5].second));
  // (c0, c1 and c3 were dropped and tombstoned by the open before the torn write.)
}

TEST_F(DiskTierTest, FlippedByteIsAnErrorNeverBytes) {
  Options o = Opts();
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  RecordLocation a = Put(*t, "value-flip", 1, 100000);
  RecordLocation b = Put(*t, "header-flip", 2, 5000);
  RecordLocation c = Put(*t, "key-flip", 3, 5000);
  RecordLocation d = Put(*t, "intact", 4, 5000);
  const std::string seg = SegmentPath(o.root_dir, a.segment_id);
  FlipByte(seg, a.offset + 64 + a.key_len + 77777);  // a value byte
  FlipByte(seg, b.offset + 40);                       // a header byte (generation)
  FlipByte(seg, c.offset + 64 + 2);                   // a key byte
  for (auto [key, loc] : {std::pair{"value-flip", a}, {"header-flip", b}, {"key-flip", c}}) {
    uint64_t before = GetReaderCounters().checksum_failures;
    uint64_t stats_before = t->stats().checksum_failures;
    std::vector<uint8_t> dst(loc.value_len);
    EXPECT_EQ(ReadRecord(o.root_dir, loc, key, dst.data(), dst.size()).error(),
              ErrorCode::CHECKSUM_MISMATCH)
        << key;
    EXPECT_EQ(GetReaderCounters().checksum_failures, before + 1) << key;
    EXPECT_EQ(t->stats().checksum_failures, stats_before + 1) << key;
  }
  EXPECT_TRUE(ReadsBack(o.root_dir, "intact", d));
}

TEST_F(DiskTierTest, CapacityFullThenRemoveAndCompactFreesSpace) {
  Options o = Opts(256 * kKiB, 1 * kMiB);
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  std::vector<std::pair<std::string, RecordLocation>> recs;
  ErrorCode last = FillUntilFull(*t, "f", 100, 60000, &recs);
  EXPECT_EQ(last, ErrorCode::NO_AVAILABLE_HANDLE);
  ASSERT_GT(recs.size(), 8u);
  Stats s = t->stats();
  EXPECT_LE(s.used_bytes, o.capacity_bytes);
  EXPECT_EQ(s.objects, recs.size());
  // Nothing was written by the refused append: the same bytes on disk.
  uint64_t disk = 0;
  for (auto& f : SegmentFiles(o.root_dir)) disk += fs::file_size(f);
  EXPECT_EQ(disk, s.used_bytes);
  auto v = ValueOf("x", 1, 60000);
  EXPECT_EQ(t->Append("x", v.data(), v.size(), 1).error(), ErrorCode::NO_AVAILABLE_HANDLE);
  for (auto& [k, l] : recs) ASSERT_TRUE(ReadsBack(o.root_dir, k, l));
  // Remove all but every fourth, compact until nothing is left to do.
  std::map<std::string, RecordLocation> keep;
  for (size_t i = 0; i < recs.size(); i++) {
    if (i % 4 == 0) keep[recs[i].first] = recs[i].second;
    else ASSERT_TRUE(t->Remove(recs[i].first, 1).ok());
  }
  std::map<std::string, RecordLocation> moved;
  t->SetRelocationCallback([&](std::string_view k, const RecordLocation& from, const RecordLocation& to) {
    ASSERT_EQ(keep[std::string(k)], from);
    keep[std::string(k)] = to;
  });
  for (int i = 0; i < 20; i++) ASSERT_TRUE(t->Compact(0).ok());
  EXPECT_GT(t->stats().compactions, 0u);
  EXPECT_EQ(Live(*t), keep);
  for (auto& [k, l] : keep) ASSERT_TRUE(ReadsBack(o.root_dir, k, l));
  EXPECT_LT(t->stats().used_bytes, o.capacity_bytes / 2 + 256 * kKiB);
  RecordLocation n = Put(*t, "x", 2, 60000);
  EXPECT_TRUE(ReadsBack(o.root_dir, "x", n));
}

TEST_F(DiskTierTest, DirectIoOnExt4AndTmpfsAndFallback) {
  for (const char* base : {"/tmp", "/dev/shm"}) {
    std::string d = MakeDir(base);
    Options o = Opts();
    o.root_dir = d + "/tier";
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    RecordLocation l = Put(*t, "d", 1, 123457);
    uint64_t direct_before = GetReaderCounters().direct_reads;
    EXPECT_TRUE(ReadsBack(o.root_dir, "d", l));
    // ext4 supports O_DIRECT, and tmpfs does since Linux 6.6.
    struct statfs sf;
    ASSERT_EQ(statfs(d.c_str(), &sf), 0);
    if (sf.f_type == 0xEF53 /* EXT4_SUPER_MAGIC */) {
      EXPECT_TRUE(t->stats().direct_io) << "O_DIRECT expected on " << base;
      EXPECT_EQ(GetReaderCounters().direct_reads, direct_before + 1);
    }
    t.reset();
    fs::remove_all(d);
  }
  // Where the filesystem refuses O_DIRECT (EINVAL, simulated in a child
  // process), the tier falls back to buffered I/O and works the same.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("MCXL_TIER_NO_ODIRECT", "1", 1);
    auto r = DiskTier::Open(Opts());
    if (!r.ok()) _exit(2);
    auto t = std::move(r).value();
    auto v = ValueOf("b", 1, 70001);
    auto l = t->Append("b", v.data(), v.size(), 1);
    if (!l.ok() || t->stats().direct_io) _exit(3);
    std::vector<uint8_t> dst(v.size());
    uint64_t direct_before = GetReaderCounters().direct_reads;
    if (!ReadRecord(t->root_dir(), l.value(), "b", dst.data(), dst.size()).ok() || dst != v) _exit(4);
    if (GetReaderCounters().direct_reads != direct_before) _exit(5);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  auto t = OpenTier(Opts());  // and the files read back with O_DIRECT
  ASSERT_TRUE(t);
  RecordLocation l = t->Lookup("b").value();
  std::vector<uint8_t> dst(l.value_len);
  ASSERT_TRUE(ReadRecord(t->root_dir(), l, "b", dst.data(), dst.size()).ok());
  EXPECT_EQ(dst, ValueOf("b", 1, 70001));
}

// Large records on an O_DIRECT fd go through io_uring (several reads in
// flight): the bytes are right, a flipped byte late in the value and a cut
// file are still errors, and with MCXL_TIER_IO_URING=0 (child) pread serves.
TEST_F(DiskTierTest, LargeRecordsThroughIoUring) {
  Options o = Opts(64 * kMiB);
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  std::vector<std::pair<std::string, RecordLocation>> recs;
  for (uint64_t len : {2 * kMiB - 100, 5 * kMiB + 123, 16 * kMiB, 9 * kMiB + 1})
    recs.emplace_back(Name("big", long(len)), Put(*t, Name("big", long(len)), 1, len));
  uint64_t before = GetReaderCounters().uring_reads;
  for (auto& [k, l] : recs) ASSERT_TRUE(ReadsBack(o.root_dir, k, l));
  if (t->stats().direct_io) {
    EXPECT_EQ(GetReaderCounters().uring_reads, before + recs.size());
  }
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("MCXL_TIER_IO_URING", "0", 1);
    uint64_t u = GetReaderCounters().uring_reads;
    std::thread th([&] {  // a fresh thread: its ring is made after the setenv
      for (auto& [k, l] : recs)
        if (!ReadsBack(o.root_dir, k, l)) _exit(2);
    });
    th.join();
    _exit(GetReaderCounters().uring_reads == u ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const RecordLocation& l = recs[1].second;
  FlipByte(SegmentPath(o.root_dir, l.segment_id), l.offset + 64 + l.key_len + l.value_len - 3);
  std::vector<uint8_t> dst(l.value_len);
  EXPECT_EQ(ReadRecord(o.root_dir, l, recs[1].first, dst.data(), dst.size()).error(),
            ErrorCode::CHECKSUM_MISMATCH);
  const RecordLocation& last = recs[3].second;
  t.reset();
  ASSERT_EQ(truncate(SegmentPath(o.root_dir, last.segment_id).c_str(),
                     off_t(last.offset + 3 * kMiB + 5)), 0);
  dst.resize(last.value_len);
  EXPECT_EQ(ReadRecord(o.root_dir, last, recs[3].first, dst.data(), dst.size()).error(),
            ErrorCode::CHECKSUM_MISMATCH);
  EXPECT_TRUE(ReadsBack(o.root_dir, recs[2].first, recs[2].second));
}

// A filesystem that is really full (a 2 MiB tmpfs mounted for the test; needs
// root, else skipped): appends fail with NO_AVAILABLE_HANDLE and leave nothing
// behind, earlier records stay readable, and after removes + compaction
// appends work again.
TEST_F(DiskTierTest, FullFilesystemGivesNoAvailableHandle) {
  const std::string mnt = dir_ + "/small";
  fs::create_directories(mnt);
  if (geteuid() != 0 || mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=2m") != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here";
  struct Unmount {
    std::string p;
    ~Unmount() { umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  Options o = Opts(512 * kKiB, 100 * kMiB);  // the filesystem fills long before capacity
  o.root_dir = mnt + "/tier";
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  std::vector<std::pair<std::string, RecordLocation>> recs;
  ErrorCode last = FillUntilFull(*t, "s", 200, 50000, &recs);
  ASSERT_EQ(last, ErrorCode::NO_AVAILABLE_HANDLE);
  ASSERT_GT(recs.size(), 10u);
  uint64_t disk = 0;
  for (auto& f : SegmentFiles(o.root_dir)) disk += fs::file_size(f);
  EXPECT_EQ(disk, t->stats().used_bytes);  // the failed append was rolled back
  for (auto& [k, l] : recs) ASSERT_TRUE(ReadsBack(o.root_dir, k, l));
  auto v = ValueOf("again", 1, 50000);
  EXPECT_EQ(t->Append("again", v.data(), v.size(), 1).error(), ErrorCode::NO_AVAILABLE_HANDLE);
  // Free whole segments (nothing to copy), then compact.
  std::map<std::string, RecordLocation> keep;
  for (auto& [k, l] : recs) {
    if (l.segment_id == recs.back().second.segment_id) keep[k] = l;
    else if (!t->Remove(k, 1).ok()) {
      // The tombstone itself may not fit: compact what is freed so far and retry.
      ASSERT_TRUE(t->Compact(0).ok());
      ASSERT_TRUE(t->Remove(k, 1).ok());
    }
  }
  for (int i = 0; i < 20; i++) (void)t->Compact(0);
  EXPECT_GT(t->stats().compactions, 0u);
  RecordLocation n = Put(*t, "again", 2, 50000);
  EXPECT_TRUE(ReadsBack(o.root_dir, "again", n));
  keep["again"] = n;
  EXPECT_EQ(Live(*t), keep);
  t.reset();
  t = OpenTier(o);
  EXPECT_EQ(Live(*t), keep);
}

}  // namespace
}  // namespace mcxl::tier
