// Master, in process, against stores into the pool that only a hostile or
// buggy client would make: a COMPLETE entry the master never inserted, an
// entry's object_offset / value_size or a header's key_len overwritten, the
// superblock's max_probe overwritten, the pool file shrunk. The master must
// never dereference what it reads, count each corrupt entry, skip it in every
// scan and lookup, and reclaim it (freeing only the extent its own allocator
// handle names); a shrunk pool makes it refuse every request.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "mooncake_cxl/master/master.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "test_util/master_fixture.h"

namespace mcxl {
namespace {

using testutil::kMiB;
using testutil::StatusOf;

std::string AllKeysOf(const Master& m) {
  bool truncated = false;
  return m.AllKeys(UINT64_MAX, &truncated);
}

class MasterCorruptionTest : public testutil::StartedMasterFixture {
 protected:
  void SetUp() override {
    StartedMasterFixture::SetUp();
    if (!HasFatalFailure()) client_ = Attach("c");
  }
  PutStartItem Put(const std::string& key, uint64_t size) { return MasterFixture::Put(client_, key, size); }
  IndexEntry& Entry(uint64_t slot) { return master_->pool().index()[slot]; }
  ObjectHeader* Header(uint64_t slot) {
    return master_->pool().At<ObjectHeader>(Entry(slot).object_offset.load());
  }

  ClientRef client_;
};

TEST_F(MasterCorruptionTest, EntryTheMasterNeverInsertedIsSkippedAndTombstoned) {
  PutStartItem keep = Put("keep", 1000);
  uint64_t used = master_->stats().allocated_bytes;
  uint64_t slot = (keep.entry_slot + 100) % index_->capacity();
  Entry(slot).object_offset.store(1ull << 62);
  Entry(slot).value_size.store(1ull << 40);
  Entry(slot).key_hash.store(KeyHash("ghost"));
  Entry(slot).state_gen.store(PackStateGen(7, EntryState::kComplete));
  EXPECT_EQ(AllKeysOf(*master_), "keep");
  EXPECT_EQ(master_->QueryKey("ghost").first, 404);
  EXPECT_FALSE(Found("ghost"));
  EXPECT_EQ(master_->stats().corrupt_entries, 1u);
  master_->Tick();
  EXPECT_EQ(StateOf(Entry(slot).state_gen.load()), EntryState::kEmpty);  // tombstone, then EMPTY
  EXPECT_EQ(master_->stats().allocated_bytes, used);  // nothing of ours was freed
  EXPECT_TRUE(Found("keep"));
  EXPECT_NE(master_->MetricsText().find("mooncake_cxl_corrupt_entries_total 1"), std::string::npos);
}

TEST_F(MasterCorruptionTest, OverwrittenKeyLenObjectOffsetOrValueSizeIsReclaimed) {
  for (int field = 0; field < 3; ++field) {
    std::string victim = "victim" + std::to_string(field);
    Put("other", 2000);
    uint64_t used_other = master_->stats().allocated_bytes;
    PutStartItem v = Put(victim, 3000);
    uint64_t slot = v.entry_slot;
    if (field == 0) Header(slot)->key_len = 0xFFFFFFFFu;
    if (field == 1) Entry(slot).object_offset.store(~uint64_t(0) - 63);
    if (field == 2) Entry(slot).value_size.store(1ull << 62);
    EXPECT_EQ(AllKeysOf(*master_), "other") << field;  // never 4 GiB of "key", nor bytes outside the pool
    EXPECT_FALSE(Found(victim)) << field;  // a miss for readers, never a read outside the data region
    if (field == 2) {
      EXPECT_EQ(index_->corrupt_seen(), 1u);  // key matched, value out of bounds: counted
    }
    master_->Tick();  // reclaims: tombstone + free of the master's own extent
    EXPECT_EQ(master_->stats().allocated_bytes, used_other) << field;
    EXPECT_EQ(master_->stats().complete_keys, 1u) << field;
    Put(victim, 500);
    EXPECT_TRUE(Found(victim)) << field;
    EXPECT_EQ(RemoveMatching(MessageType::kRemoveAll, "", true).count, 2u) << field;
    EXPECT_EQ(master_->stats().allocated_bytes, 0u) << field;
  }
  EXPECT_EQ(master_->stats().corrupt_entries, 3u);
}

TEST_F(MasterCorruptionTest, OverwrittenMaxProbeIsRestored) {
  Put("a", 100);
  uint64_t mine = index_->max_probe();
  Superblock* sb = master_->pool().superblock();
  sb->max_probe.store(~uint64_t(0));
  EXPECT_TRUE(Found("a"));  // readers clamp it to the capacity
  master_->Tick();
  EXPECT_EQ(sb->max_probe.load(), mine);
  EXPECT_EQ(master_->stats().corrupt_entries, 1u);
}

TEST_F(MasterCorruptionTest, ShrunkPoolIsRefusedNotDereferenced) {
  Put("a", 100);
  ASSERT_EQ(truncate(config_.cxl_path.c_str(), 8 * kMiB), 0);
  usleep(600 * 1000);  // past the size-check interval
  master_->Tick();
  EXPECT_TRUE(master_->stats().pool_lost);
  EXPECT_EQ(StatusOf(Call(MessageType::kPing, "")), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  EXPECT_EQ(AllKeysOf(*master_), "");
  EXPECT_NE(master_->MetricsText().find("mooncake_cxl_pool_lost 1"), std::string::npos);
  EXPECT_EQ(master_->QueryKey("a").first, 503);
}

}  // namespace
}  // namespace mcxl
