// DiskTier (SSD tier segment files): crc32c vectors; round trip across
// segments; rebuild from the files alone (newest generation wins, tombstones
// hide older records); a torn tail at any byte; flipped bytes give
// CHECKSUM_MISMATCH and a counter, never bytes; capacity full; compaction
// (relocations, old segment deleted, crash at each step loses nothing live);
// O_DIRECT on ext4 and the tmpfs fallback; a forked writer with concurrent
// reader processes.
#include "mooncake_cxl/tier/disk_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_cxl/common/log.h"

namespace mcxl::tier {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

// prefix + number (not operator+: GCC 12 warns falsely, -Wrestrict).
std::string Name(const char* prefix, long n) {
  std::string s = prefix;
  s += std::to_string(n);
  return s;
}

// Deterministic value of (key, generation, length).
std::vector<uint8_t> ValueOf(const std::string& key, uint64_t gen, uint64_t len) {
  std::vector<uint8_t> v(len);
  uint64_t x = std::hash<std::string>()(key) ^ (gen * 0x9e3779b97f4a7c15ull);
  for (uint64_t i = 0; i < len; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = uint8_t(x);
  }
  return v;
}

std::string MakeDir(const char* base) {
  std::string tmpl = std::string(base) + "/mcxl_disk_tier_test.XXXXXX";
  char* p = mkdtemp(tmpl.data());
  EXPECT_NE(p, nullptr);
  return tmpl;
}

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel(LogLevel::kError);
    dir_ = MakeDir("/tmp");
  }
  void TearDown() override { fs::remove_all(dir_); }
  Options Opts(uint64_t segment = 1 * kMiB, uint64_t capacity = 64 * kMiB) const {
    Options o;
    o.root_dir = dir_ + "/tier";
    o.segment_bytes = segment;
    o.capacity_bytes = capacity;
    return o;
  }
  std::unique_ptr<DiskTier> OpenTier(const Options& o) {
    auto r = DiskTier::Open(o);
    EXPECT_TRUE(r.ok()) << ErrorCodeName(r.error());
    return r.ok() ? std::move(r).value() : nullptr;
  }
  // Reads key at loc and compares with ValueOf.
  ::testing::AssertionResult ReadsBack(const std::string& root, const std::string& key,
                                       const RecordLocation& loc) {
    std::vector<uint8_t> got(loc.value_len + 1, 0xee);
    Status s = ReadRecord(root, loc, key, got.data(), loc.value_len);
    if (!s.ok()) return ::testing::AssertionFailure() << key << ": " << ErrorCodeName(s.error());
    got.resize(loc.value_len);
    if (got != ValueOf(key, loc.generation, loc.value_len))
      return ::testing::AssertionFailure() << key << ": wrong bytes";
    return ::testing::AssertionSuccess();
  }
  std::map<std::string, RecordLocation> Live(const DiskTier& t) {
    std::map<std::string, RecordLocation> m;
    t.ForEachLive([&](std::string_view k, const RecordLocation& l) { m[std::string(k)] = l; });
    return m;
  }
  RecordLocation Put(DiskTier& t, const std::string& key, uint64_t gen, uint64_t len) {
    auto v = ValueOf(key, gen, len);
    auto r = t.Append(key, v.data(), len, gen);
    EXPECT_TRUE(r.ok()) << key << " " << ErrorCodeName(r.error());
    return r.ok() ? r.value() : RecordLocation{};
  }
  // Appends prefix0, prefix1, ... (generation 1, len bytes each) until one fails or max
  // are in; the written ones go to recs. The failed append's code, or OK.
  ErrorCode FillUntilFull(DiskTier& t, const char* prefix, int max, uint64_t len,
                          std::vector<std::pair<std::string, RecordLocation>>* recs) {
    for (int i = 0; i < max; i++) {
      std::string k = Name(prefix, i);
      auto v = ValueOf(k, 1, len);
      auto r = t.Append(k, v.data(), v.size(), 1);
      if (!r.ok()) return r.error();
      recs->emplace_back(k, r.value());
    }
    return ErrorCode::OK;
  }
  std::string dir_;
};

std::vector<std::string> SegmentFiles(const std::string& root) {
  std::vector<std::string> v;
  for (auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind("seg-", 0) == 0) v.push_back(e.path().string());
  std::sort(v.begin(), v.end());
  return v;
}

void FlipByte(const std::string& path, uint64_t off) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b;
  ASSERT_EQ(pread(fd, &b, 1, off_t(off)), 1);
  b ^= 0x40;
  ASSERT_EQ(pwrite(fd, &b, 1, off_t(off)), 1);
  close(fd);
}

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


void CopyDir(const std::string& from, const std::string& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
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
// block 0) is not rebuilt, and the records after a corrupt header still are.
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
  EXPECT_EQ(live.size(), 4u);
  for (int i : {0, 1, 3, 5}) {
    ASSERT_TRUE(live.count(recs[i].first));
    EXPECT_EQ(live[recs[i].first], recs[i].second);
    EXPECT_TRUE(ReadsBack(o.root_dir, recs[i].first, recs[i].second));
  }
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


// AppendBatch: per-item results like Append (bad key, stale generation), the
// fallbacks (a value over 1 MiB, a repeated key), batches over 4 MiB and over
// a segment's end; everything reads back and survives a reopen.
TEST_F(DiskTierTest, AppendBatchResultsPerRecordAndReopen) {
  Options o = Opts(1 * kMiB);
  std::map<std::string, RecordLocation> want;
  {
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    Put(*t, "stale", 10, 100);
    std::vector<std::string> keys;
    std::vector<std::vector<uint8_t>> vals;
    std::vector<uint64_t> gens;
    for (int i = 0; i < 90; i++) {
      keys.push_back(Name("b", i));
      gens.push_back(i + 1);
    }
    keys[5] = "";          // INVALID_PARAMS
    keys[7] = "stale";     // generation 8 < 10: INVALID_VERSION
    keys[9] = keys[8];     // repeated key, newer generation: the later one wins
    std::vector<uint64_t> lens(keys.size());
    for (size_t i = 0; i < keys.size(); i++) lens[i] = 60 * kKiB + i * 100;
    lens[20] = 2 * kMiB + 3;  // over 1 MiB: written by itself
    lens[21] = 0;             // an empty value is a valid record
    std::vector<DiskTier::BatchItem> items;
    for (size_t i = 0; i < keys.size(); i++) vals.push_back(ValueOf(keys[i], gens[i], lens[i]));
    for (size_t i = 0; i < keys.size(); i++) items.push_back({keys[i], vals[i].data(), lens[i], gens[i]});
    auto res = t->AppendBatch(items);
    ASSERT_EQ(res.size(), items.size());
    for (size_t i = 0; i < keys.size(); i++) {
      if (i == 5) {
        ASSERT_FALSE(res[i].ok());
        EXPECT_EQ(res[i].error(), ErrorCode::INVALID_PARAMS);
      } else if (i == 7) {
        ASSERT_FALSE(res[i].ok());
        EXPECT_EQ(res[i].error(), ErrorCode::INVALID_VERSION);
      } else {
        ASSERT_TRUE(res[i].ok()) << i << " " << ErrorCodeName(res[i].error());
        EXPECT_EQ(res[i].value().generation, gens[i]);
        EXPECT_EQ(res[i].value().value_len, lens[i]);
        EXPECT_TRUE(ReadsBack(o.root_dir, keys[i], res[i].value()));
        if (i != 8) want[keys[i]] = res[i].value();
      }
    }
    want["stale"] = t->Lookup("stale").value();
    EXPECT_EQ(Live(*t), want);
    EXPECT_GT(SegmentFiles(o.root_dir).size(), 6u);  // ~7.5 MiB over 1 MiB segments
    EXPECT_EQ(t->stats().objects, want.size());
  }
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  EXPECT_EQ(Live(*t), want);
  for (auto& [k, l] : want) EXPECT_TRUE(ReadsBack(o.root_dir, k, l));
}

// A batch that does not fit the capacity as a whole: records go one by one
// until the tier is full; the rest get NO_AVAILABLE_HANDLE and count nothing.
TEST_F(DiskTierTest, AppendBatchOverCapacityFailsOnlyTheRest) {
  Options o = Opts(16 * kMiB, 1 * kMiB);
  o.reserve_bytes = 0;
  auto t = OpenTier(o);
  ASSERT_TRUE(t);
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> vals;
  std::vector<DiskTier::BatchItem> items;
  for (int i = 0; i < 30; i++) keys.push_back(Name("c", i));
  for (auto& k : keys) vals.push_back(ValueOf(k, 1, 60 * kKiB));
  for (size_t i = 0; i < keys.size(); i++) items.push_back({keys[i], vals[i].data(), 60 * kKiB, 1});
  auto res = t->AppendBatch(items);
  size_t ok = 0;
  for (size_t i = 0; i < res.size(); i++) {
    if (res[i].ok()) {
      EXPECT_EQ(ok, i) << "a record after a failed one was written";
      EXPECT_TRUE(ReadsBack(o.root_dir, keys[i], res[i].value()));
      ok++;
    } else {
      EXPECT_EQ(res[i].error(), ErrorCode::NO_AVAILABLE_HANDLE);
    }
  }
  EXPECT_GT(ok, 10u);
  EXPECT_LT(ok, keys.size());
  EXPECT_EQ(t->stats().objects, ok);
  EXPECT_LE(t->stats().used_bytes, o.capacity_bytes);
}

// A batch is one write: a crash can leave any prefix of it (truncate at any
// byte) or lose any run of its bytes (zeroed). Rebuild keeps every record
// whose bytes are intact (and those before the batch), drops a cut-off tail;
// a record with a hole is dropped or reads as CHECKSUM_MISMATCH, never bytes.
TEST_F(DiskTierTest, TornBatchAtAnyByteKeepsIntactRecords) {
  Options o = Opts(64 * kMiB);
  std::vector<std::pair<std::string, RecordLocation>> recs;
  {
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    for (int i = 0; i < 3; i++) recs.emplace_back(Name("s", i), Put(*t, Name("s", i), 1, 7000));
    std::mt19937_64 rng(5);
    std::vector<std::string> keys;
    std::vector<std::vector<uint8_t>> vals;
    std::vector<DiskTier::BatchItem> items;
    for (int i = 0; i < 30; i++) keys.push_back(Name("t", i));
    for (size_t i = 0; i < keys.size(); i++) vals.push_back(ValueOf(keys[i], i + 2, rng() % (40 * kKiB) + 10));
    for (size_t i = 0; i < keys.size(); i++) items.push_back({keys[i], vals[i].data(), vals[i].size(), i + 2});
    auto res = t->AppendBatch(items);
    for (size_t i = 0; i < keys.size(); i++) {
      ASSERT_TRUE(res[i].ok());
      recs.emplace_back(keys[i], res[i].value());
    }
  }
  auto files = SegmentFiles(o.root_dir);
  ASSERT_EQ(files.size(), 1u);
  const uint64_t size = fs::file_size(files[0]);
  const uint64_t batch_start = recs[3].second.offset;
  std::mt19937_64 rng(13);
  const std::string copy = dir_ + "/copy";
  auto end_of = [](const RecordLocation& l) { return l.offset + 64 + l.key_len + l.value_len; };
  for (int round = 0; round < 60; round++) {
    // [lo, hi): the bytes the crash lost; truncation when hi == size.
    uint64_t lo = batch_start + rng() % (size - batch_start);
    uint64_t hi = round % 2 == 0 ? size : std::min(size, lo + 1 + rng() % (96 * kKiB));
    if (round == 0) lo = batch_start;
    if (round == 1) lo = batch_start + 1;
    CopyDir(o.root_dir, copy);
    const std::string seg = SegmentPath(copy, recs[0].second.segment_id);
    if (hi == size) {
      ASSERT_EQ(truncate(seg.c_str(), off_t(lo)), 0);
    } else {
      int fd = open(seg.c_str(), O_RDWR);
      ASSERT_GE(fd, 0);
      std::vector<uint8_t> z(hi - lo, 0);
      ASSERT_EQ(pwrite(fd, z.data(), z.size(), off_t(lo)), ssize_t(z.size()));
      close(fd);
    }
    Options oc = o;
    oc.root_dir = copy;
    auto t = OpenTier(oc);
    ASSERT_TRUE(t);
    auto live = Live(*t);
    for (auto& [k, l] : recs) {
      bool intact = end_of(l) <= lo || l.offset >= hi;
      if (intact) {
        ASSERT_TRUE(live.count(k)) << "lost [" << lo << "," << hi << ") " << k;
        EXPECT_EQ(live[k], l);
        EXPECT_TRUE(ReadsBack(copy, k, l));
      } else if (hi == size || !live.count(k)) {
        EXPECT_FALSE(live.count(k)) << "kept torn [" << lo << "," << hi << ") " << k;
      } else {
        // A hole inside a record whose successor's header survived: rebuild
        // does not read its value (disk_tier.h), the read reports it.
        std::vector<uint8_t> got(l.value_len + 1);
        EXPECT_EQ(ReadRecord(copy, live[k], k, got.data(), l.value_len).error(), ErrorCode::CHECKSUM_MISMATCH)
            << "torn [" << lo << "," << hi << ") " << k;
      }
    }
    std::vector<uint8_t> v = ValueOf("new", 1000, 5000);
    auto r = t->AppendBatch({{"new", v.data(), v.size(), 1000}});
    ASSERT_TRUE(r[0].ok());
    EXPECT_TRUE(ReadsBack(copy, "new", r[0].value()));
  }
}

TEST_F(DiskTierTest, RemoveBatchIsOneWriteAndSurvivesReopen) {
  Options o = Opts(256 * kKiB);
  std::map<std::string, RecordLocation> expect;
  uint64_t segments_before = 0;
  {
    auto t = OpenTier(o);
    ASSERT_TRUE(t);
    for (int i = 0; i < 40; i++) expect[Name("k", i)] = Put(*t, Name("k", i), 10, 3000);
    const std::string big(20000, 'L');  // a long key: a multi-block tombstone
    expect[big] = Put(*t, big, 10, 100);
    segments_before = t->stats().segments;
    std::vector<std::pair<std::string_view, uint64_t>> items;
    std::vector<std::string> names;
    for (int i = 0; i < 40; i += 2) names.push_back(Name("k", i));
    for (const auto& n : names) items.emplace_back(n, 10);
    items.emplace_back(big, 11);
    items.emplace_back("k1", 9);        // older than the live record: nothing to hide
    items.emplace_back("nope", 5);      // no record at all
    items.emplace_back(names[0], 12);   // repeated: after the first one
    items.emplace_back("", 1);          // bad key
    auto st = t->RemoveBatch(items);
    ASSERT_EQ(st.size(), items.size());
    for (size_t i = 0; i + 1 < items.size(); ++i) EXPECT_TRUE(st[i].ok()) << i;
    EXPECT_EQ(st.back().error(), ErrorCode::INVALID_PARAMS);
    for (const auto& n : names) expect.erase(n);
    expect.erase(big);
    EXPECT_EQ(Live(*t), expect);
    // Tombstones fence the generations they hide: no append at or below them.
    auto v = ValueOf(big, 11, 10);
    EXPECT_EQ(t->Append(big, v.data(), 10, 11).error(), ErrorCode::INVALID_VERSION);
    EXPECT_EQ(t->MaxGeneration(), 11u);  // the repeated key had nothing left to hide: not written
  }
  auto t = OpenTier(o);  // rebuild from the files: the batch's tombstones count
  ASSERT_TRUE(t);
  EXPECT_EQ(Live(*t), expect);
  EXPECT_GE(t->stats().segments, segments_before);
  for (auto& [k, l] : expect) EXPECT_TRUE(ReadsBack(o.root_dir, k, l));
}

}  // namespace
}  // namespace mcxl::tier
