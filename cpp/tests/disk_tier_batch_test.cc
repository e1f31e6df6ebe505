// DiskTier's batched writes: AppendBatch's per-record results (and the
// records after a reopen), a batch over the capacity failing only the rest,
// a torn batch at any byte keeping the intact records, RemoveBatch as one
// write that survives a reopen.
#include "mooncake_cxl/tier/disk_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "mooncake_cxl/common/log.h"
#include "test_util/disk_tier_fixture.h"

namespace mcxl::tier {
namespace {

using namespace testutil;

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
