// The index as a capacity (master_eviction.cc): past
// --index_high_watermark_ratio a put evicts the least recently used objects
// for their slots, a key whose probe window is full gets a slot there by
// evicting the window's oldest object, and neither makes a put wait.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "mooncake_cxl/master/master.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "test_util/master_fixture.h"

namespace mcxl {
namespace {

using testutil::kMiB;
using testutil::ValueFor;

constexpr uint64_t kCapacity = 1024;

class IndexEvictionTest : public testutil::MasterFixture {
 protected:
  void SetUp() override {
    MasterFixture::SetUp();
    config_.cxl_size = 16 * kMiB;
    config_.index_capacity = kCapacity;
  }
  // Puts and publishes `keys` (64-byte values) in one PutStart; every put
  // must succeed.
  void PutAll(const ClientRef& c, const std::vector<std::string>& keys) {
    PutStartReply r = PutStart(c, keys, std::vector<uint64_t>(keys.size(), 64));
    ASSERT_EQ(r.items.size(), keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(r.items[i].status, ErrorCode::OK) << keys[i];
      WriteAndPublish(r.items[i], ValueFor(keys[i], 64));
    }
    master_->Tick();
  }
};

TEST_F(IndexEvictionTest, TinyObjectsPastTheWatermarkEvictTheOldest) {
  StartMaster();
  ClientRef c = Attach();
  const uint64_t limit = uint64_t(config_.index_high_watermark_ratio * kCapacity);
  int n = 0;
  for (int batch = 0; batch < 30; ++batch) {  // 3x the index's capacity
    std::vector<std::string> keys;
    for (int i = 0; i < 100; ++i) keys.push_back("tiny/" + std::to_string(n++));
    PutAll(c, keys);
    ASSERT_LE(master_->stats().index_live_entries, limit) << "after batch " << batch;
  }
  MasterStats st = master_->stats();
  EXPECT_GE(st.index_evicted_keys, uint64_t(n) - limit);
  EXPECT_EQ(st.index_evicted_keys, st.evicted_keys);  // the data region stayed far below its watermark
  EXPECT_EQ(st.put_failures, 0u);
  // The newest batch is all there, the first one all gone.
  for (int i = n - 100; i < n; ++i) EXPECT_EQ(Get("tiny/" + std::to_string(i)), ValueFor("tiny/" + std::to_string(i), 64));
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(Found("tiny/" + std::to_string(i)));
}

TEST_F(IndexEvictionTest, AFullProbeWindowEvictsItsOldestObjects) {
  StartMaster();
  ClientRef c = Attach();
  // kMaxProbeSlots + 1 keys with one home slot.
  std::map<uint64_t, std::vector<std::string>> by_home;
  std::vector<std::string> same;
  for (int i = 0; same.empty(); ++i) {
    std::string k = "home/" + std::to_string(i);
    auto& v = by_home[KeyHash(k) & (kCapacity - 1)];
    v.push_back(k);
    if (v.size() == ObjectIndex::kMaxProbeSlots + 1) same = v;
  }
  for (size_t i = 0; i < ObjectIndex::kMaxProbeSlots; ++i) PutAll(c, {same[i]});
  EXPECT_EQ(master_->stats().index_window_evictions, 0u);
  PutAll(c, {same.back()});  // the window is full: its kWindowEvictions oldest objects go
  MasterStats st = master_->stats();
  EXPECT_EQ(st.index_window_evictions, kWindowEvictions);
  EXPECT_EQ(st.index_evicted_keys, kWindowEvictions);
  for (size_t i = 0; i < kWindowEvictions; ++i) EXPECT_FALSE(Found(same[i])) << same[i];
  for (size_t i = kWindowEvictions; i < same.size(); ++i) EXPECT_EQ(Get(same[i]), ValueFor(same[i], 64)) << same[i];
  // The next new keys of that window find its freed slots: no more evictions.
  std::vector<std::string> more;
  for (int i = 0; more.size() < kWindowEvictions - 1; ++i) {
    std::string k = "more/" + std::to_string(i);
    if ((KeyHash(k) & (kCapacity - 1)) == (KeyHash(same[0]) & (kCapacity - 1))) more.push_back(k);
  }
  PutAll(c, more);
  EXPECT_EQ(master_->stats().index_window_evictions, kWindowEvictions);
  for (const auto& k : more) EXPECT_EQ(Get(k), ValueFor(k, 64)) << k;
}

TEST_F(IndexEvictionTest, AWindowOfUnfinishedPutsIsBusyNotFull) {
  StartMaster();
  ClientRef c = Attach();
  std::map<uint64_t, std::vector<std::string>> by_home;
  std::vector<std::string> same;
  for (int i = 0; same.empty(); ++i) {
    std::string k = "busy/" + std::to_string(i);
    auto& v = by_home[KeyHash(k) & (kCapacity - 1)];
    v.push_back(k);
    if (v.size() == ObjectIndex::kMaxProbeSlots + 1) same = v;
  }
  std::vector<std::string> first(same.begin(), same.end() - 1);
  PutStartReply r = PutStart(c, first, std::vector<uint64_t>(first.size(), 64));
  for (const auto& it : r.items) ASSERT_EQ(it.status, ErrorCode::OK);
  // Nothing in the window can go yet: "retry", since the puts will finish.
  PutStartReply busy = PutStart(c, {same.back()}, {64});
  ASSERT_EQ(busy.items.size(), 1u);
  EXPECT_EQ(busy.items[0].status, ErrorCode::OBJECT_REPLICA_BUSY);
  for (size_t i = 0; i < first.size(); ++i) WriteAndPublish(r.items[i], ValueFor(first[i], 64));
  master_->Tick();
  PutAll(c, {same.back()});
  EXPECT_EQ(master_->stats().index_window_evictions, kWindowEvictions);
}

TEST_F(IndexEvictionTest, WatermarkOutsideItsRangeIsRefused) {
  config_.index_high_watermark_ratio = 0.99;
  EXPECT_EQ(Master::Create(config_).error(), ErrorCode::INVALID_PARAMS);
  config_.index_high_watermark_ratio = 0.05;
  EXPECT_EQ(Master::Create(config_).error(), ErrorCode::INVALID_PARAMS);
}

}  // namespace
}  // namespace mcxl
