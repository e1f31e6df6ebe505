// DiskTierTest: a DiskTier in a fresh directory under /tmp, with the
// helpers the SSD tier's tests share: deterministic values of (key,
// generation, length), a put, a read-back check, the live records, filling
// the tier, its segment files, a flipped byte, a copy of the directory.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/tier/disk_tier.h"

namespace mcxl::tier {
namespace testutil {

namespace fs = std::filesystem;
constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

// prefix + number (not operator+: GCC 12 warns falsely, -Wrestrict).
inline std::string Name(const char* prefix, long n) {
  std::string s = prefix;
  s += std::to_string(n);
  return s;
}

// Deterministic value of (key, generation, length).
inline std::vector<uint8_t> ValueOf(const std::string& key, uint64_t gen, uint64_t len) {
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

inline std::string MakeDir(const char* base) {
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

inline std::vector<std::string> SegmentFiles(const std::string& root) {
  std::vector<std::string> v;
  for (auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind("seg-", 0) == 0) v.push_back(e.path().string());
  std::sort(v.begin(), v.end());
  return v;
}

inline void FlipByte(const std::string& path, uint64_t off) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b;
  ASSERT_EQ(pread(fd, &b, 1, off_t(off)), 1);
  b ^= 0x40;
  ASSERT_EQ(pwrite(fd, &b, 1, off_t(off)), 1);
  close(fd);
}

inline void CopyDir(const std::string& from, const std::string& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

}  // namespace testutil
}  // namespace mcxl::tier
