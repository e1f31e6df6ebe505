// Master, in process, across restarts and with views that outlive their
// attachment: recovery keeps complete objects with their bytes and revokes
// unfinished puts, settles an unsettled upsert to its newest value, refuses
// an unformatted or foreign pool file; a live client's pins survive a
// restart and a detach (the slot retired until the view goes), and the
// retired table of a client on another host expires.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "mooncake_cxl/master/master.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "test_util/master_fixture.h"

namespace mcxl {
namespace {

using testutil::Enc;
using testutil::PinInTable;
using testutil::kMiB;
using testutil::StatusOf;
using testutil::ValueFor;

class MasterRecoveryTest : public testutil::StartedMasterFixture {};

TEST_F(MasterRecoveryTest, RestartKeepsCompleteObjectsAndRevokesUnfinished) {
  ClientRef c = Attach();
  std::vector<std::string> keys;
  for (int i = 0; i < 50; ++i) {
    keys.push_back("obj/" + std::to_string(i));
    Put(c, keys.back(), 100 + i * 97);
  }
  PutStartReply unfinished = PutStart(c, {"half"}, {4096});
  ASSERT_EQ(unfinished.items.size(), 1u);
  const PutStartItem half = unfinished.items[0];
  memset(master_->pool().base() + half.value_offset, 'h', 1000);  // partly written
  PutStartReply up = PutStart(c, {keys[0]}, {64}, /*upsert=*/true);  // an upsert in flight
  ASSERT_EQ(up.items.size(), 1u);
  ASSERT_EQ(Remove(keys[1]), ErrorCode::OK);
  uint64_t incarnation = master_->pool().superblock()->master_incarnation.load();
  uint8_t uuid[16];
  memcpy(uuid, master_->pool().superblock()->uuid, 16);

  config_.format = false;
  StartMaster();  // destroys the old master first
  EXPECT_TRUE(master_->pool().Verify(uuid).ok());
  EXPECT_EQ(master_->pool().superblock()->master_incarnation.load(), incarnation + 1);
  MasterStats st = master_->stats();
  EXPECT_EQ(st.recovered_objects, 49u);
  EXPECT_EQ(st.complete_keys, 49u);
  EXPECT_EQ(st.revoked_puts, 2u);
  EXPECT_EQ(st.pending_puts, 0u);
  EXPECT_EQ(st.attached_clients, 0u);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(Get(keys[i]), i == 1 ? "" : ValueFor(keys[i], 100 + i * 97)) << keys[i];
  EXPECT_EQ(Get("half"), "");
  EXPECT_FALSE(index_->PublishComplete(half.entry_slot, half.generation));
  EXPECT_FALSE(index_->PublishComplete(up.items[0].entry_slot, up.items[0].generation));
  auto s = index_->FindComplete(keys[0], KeyHash(keys[0]));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->flags & kFlagSuperseded, 0u);

  // Clients must re-attach; the store keeps working and rejects duplicates.
  EXPECT_EQ(PutStart(c, {"new"}, {10}).status, ErrorCode::ILLEGAL_CLIENT);
  ClientRef c2 = Attach();
  PutStartReply dup = PutStart(c2, {keys[2]}, {10});
  ASSERT_EQ(dup.items.size(), 1u);
  EXPECT_EQ(dup.items[0].status, ErrorCode::OBJECT_ALREADY_EXISTS);
  Put(c2, "half", 4096);
  EXPECT_EQ(Get("half"), ValueFor("half", 4096));
  EXPECT_EQ(Remove(keys[3]), ErrorCode::OK);
  CountReply all = RemoveMatching(MessageType::kRemoveAll, "", true);
  EXPECT_EQ(all.count, 49u);
}

TEST_F(MasterRecoveryTest, RestartAfterUnsettledUpsertKeepsNewest) {
  ClientRef c = Attach();
  Put(c, "k", 100);
  PutStartReply up = PutStart(c, {"k"}, {3000}, /*upsert=*/true);
  ASSERT_EQ(up.items.size(), 1u);
  std::string v2(3000, 'n');
  WriteAndPublish(up.items[0], v2);  // both COMPLETE; the master never ticked
  config_.format = false;
  StartMaster();
  EXPECT_EQ(Get("k"), v2);
  MasterStats st = master_->stats();
  EXPECT_EQ(st.complete_keys, 1u);
  EXPECT_EQ(st.allocated_bytes, ExtentBytes(1, 3000));  // the old extent is free
  auto s = index_->FindComplete("k", KeyHash("k"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->flags & kFlagSuperseded, 0u);
}

TEST_F(MasterRecoveryTest, RestartOnUnformattedOrForeignFileFails) {
  master_.reset();
  index_.reset();
  MasterConfig cfg = config_;
  cfg.cxl_path = dir() + "/missing";
  cfg.format = false;
  cfg.cxl_size = 0;  // no size to create it at: a missing pool fails
  EXPECT_FALSE(Master::Create(cfg).ok());
  // With --cxl_size, a missing path is created as --format would (Mooncake's
  // master starts before its CXL file exists): 0600, that size, formatted.
  cfg.cxl_size = config_.cxl_size;
  {
    auto created = Master::Create(cfg);
    ASSERT_TRUE(created.ok());
    struct stat st {};
    ASSERT_EQ(stat(cfg.cxl_path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(uint64_t(st.st_size), config_.cxl_size);
  }
  cfg.cxl_path = config_.cxl_path;
  // Corrupt the layout version: the master refuses rather than re-formatting.
  {
    auto pool = Pool::Open(cfg.cxl_path, 0, false);
    ASSERT_TRUE(pool.ok());
    (*pool)->superblock()->layout_version += 1;
  }
  EXPECT_EQ(Master::Create(cfg).error(), ErrorCode::INVALID_PARAMS);
}

// ---- Pins of a live process outlive its attachment.

TEST_F(MasterRecoveryTest, RestartKeepsALiveClientsPinsAndTheViewedExtent) {
  ClientRef c = Attach();
  Put(c, "viewed", 4096);
  auto snap = index_->FindComplete("viewed", KeyHash("viewed"));
  ASSERT_TRUE(snap.ok());
  PinInTable(master_->pool(), c.slot, 0, *snap);
  const char* bytes = index_->ValuePtr(*snap, "viewed");
  ASSERT_EQ(Remove("viewed"), ErrorCode::OK);  // a view does not refuse: unlinked, extent kept
  uint64_t used = master_->stats().allocated_bytes;
  config_.format = false;
  StartMaster();  // this process (the pin's owner) is alive
  EXPECT_EQ(master_->stats().allocated_bytes, used) << "recovery freed an extent a live view shows";
  EXPECT_NE(master_->pool().client_slot(c.slot)->generation.load() & kSlotRetired, 0u);
  // Another client fills the pool: the viewed bytes stay.
  ClientRef other = Attach("client:2");
  EXPECT_NE(other.slot, c.slot) << "a retired slot was handed to another client";
  for (int i = 0; i < 80; ++i) {
    PutStartReply r = PutStart(other, {"fill/" + std::to_string(i)}, {kMiB});
    if (r.items.at(0).status != ErrorCode::OK) break;
    WriteAndPublish(r.items[0], std::string(kMiB, 'f'));
  }
  EXPECT_EQ(std::string(bytes, 4096), ValueFor("viewed", 4096));
  // The owner re-attaches naming its old identity: same slot, pins kept.
  AttachRequest req = AttachRequestFor("client:1");
  req.prev_slot = c.slot;
  req.prev_generation = c.generation;
  AttachReply back = AttachWith(req);
  ASSERT_EQ(back.status, ErrorCode::OK);
  EXPECT_EQ(back.slot, c.slot);
  EXPECT_NE(master_->pool().pin_table(c.slot)[0].object_offset.load(), 0u);
  // Dropping the view frees the extent.
  master_->pool().pin_table(c.slot)[0].object_offset.store(0);
  master_->pool().client_slot(c.slot)->pins_in_use.fetch_sub(1);
  uint64_t before = master_->stats().allocated_bytes;
  for (int i = 0; i < 100 && master_->stats().allocated_bytes == before; ++i) {
    master_->Tick();
    usleep(10000);
  }
  EXPECT_EQ(master_->stats().allocated_bytes, before - ExtentBytes(6, 4096));
}

TEST_F(MasterRecoveryTest, DetachWithALiveViewRetiresTheSlotUntilTheViewGoes) {
  ClientRef c = Attach();
  Put(c, "v", 4096);
  auto snap = index_->FindComplete("v", KeyHash("v"));
  ASSERT_TRUE(snap.ok());
  PinInTable(master_->pool(), c.slot, 3, *snap);
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(c))), ErrorCode::OK);
  ClientRef other = Attach("client:2");  // removes go over its connection
  EXPECT_NE(other.slot, c.slot);
  uint64_t before = master_->stats().allocated_bytes;
  EXPECT_EQ(Remove("v"), ErrorCode::OK);  // a view does not refuse a remove
  EXPECT_EQ(Get("v"), "");
  for (int i = 0; i < 20; ++i) master_->Tick();
  EXPECT_EQ(master_->stats().allocated_bytes, before) << "a closed client's view lost its pin";
  master_->pool().pin_table(c.slot)[3].object_offset.store(0);  // the view is dropped
  for (int i = 0; i < 200 && master_->stats().allocated_bytes == before; ++i) {
    master_->Tick();
    usleep(10000);
  }
  EXPECT_LT(master_->stats().allocated_bytes, before) << "the viewed extent was never freed";
  for (int i = 0; i < 200 && master_->pool().client_slot(c.slot)->generation.load() != 0; ++i) {
    master_->Tick();
    usleep(10000);
  }
  EXPECT_EQ(master_->pool().client_slot(c.slot)->generation.load(), 0u) << "the retired slot was never released";
}

TEST_F(MasterRecoveryTest, RetiredTableOfAnotherHostExpires) {
  config_.put_start_release_timeout_sec = 0;  // expire at the next client check
  StartMaster();
  // Another host's process: its pid cannot be checked from here.
  AttachReply r = AttachWith(AttachRequestFor("remote:1", 1, "some-other-host"));
  ASSERT_EQ(r.status, ErrorCode::OK);
  ClientRef c{r.slot, r.slot_generation};
  Put(c, "remote-view", 4096);
  auto snap = index_->FindComplete("remote-view", KeyHash("remote-view"));
  ASSERT_TRUE(snap.ok());
  PinInTable(master_->pool(), c.slot, 0, *snap);
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(c))), ErrorCode::OK);
  EXPECT_NE(master_->pool().client_slot(c.slot)->generation.load() & kSlotRetired, 0u);
  for (int i = 0; i < 200 && master_->pool().pin_table(c.slot)[0].object_offset.load() != 0; ++i) {
    master_->Tick();
    usleep(10000);
  }
  // The residual: the record is dropped (the handle's PinHeld check fails
  // and access raises) and the slot is free again.
  EXPECT_EQ(master_->pool().pin_table(c.slot)[0].object_offset.load(), 0u);
  EXPECT_EQ(master_->pool().client_slot(c.slot)->generation.load(), 0u);
  Attach("client:2");  // removes go over an attached client's connection
  EXPECT_EQ(Remove("remote-view"), ErrorCode::OK);
}

}  // namespace
}  // namespace mcxl
