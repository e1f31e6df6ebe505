// The pin-table bitmap's contract (MasterImpl::pin_tables_): ScanPins reads
// only the tables whose bit is set, so every way a table becomes live must
// set it: an attach, a retire at reclaim or detach (RetireOrClearPins), a
// retire at recovery (RecoverPinTable), and a re-attach taking back a
// retired slot. For each, a viewed object must survive eviction by another
// client's fill with its bytes, exactly as a scan of every table gives.
// A set point missed fails its step here.
#include <gtest/gtest.h>

#include <string>

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

class PinTablesTest : public testutil::StartedMasterFixture {
 protected:
  // Pins `key` in `slot`'s table (record `record`) as a client's view does.
  const char* View(const ClientRef& c, const std::string& key, uint32_t record) {
    auto snap = index_->FindComplete(key, KeyHash(key));
    EXPECT_TRUE(snap.ok()) << key;
    if (!snap.ok()) return nullptr;
    PinInTable(master_->pool(), c.slot, record, *snap);
    return index_->ValuePtr(*snap, key);
  }
  // Another client puts 1 MiB values through the 64 MiB pool twice over:
  // every unprotected object is evicted.
  void FillFrom(const ClientRef& other, const std::string& tag) {
    for (int i = 0; i < 130; ++i) {
      PutStartReply r = PutStart(other, {tag + std::to_string(i)}, {kMiB});
      ASSERT_EQ(r.status, ErrorCode::OK);
      ASSERT_EQ(r.items.at(0).status, ErrorCode::OK) << "put " << i << " of the fill";
      WriteAndPublish(r.items[0], std::string(kMiB, 'f'));
      master_->Tick();
    }
    EXPECT_GT(master_->stats().evicted_keys, 0u);
  }
  void ExpectIntact(const std::string& key, const char* bytes, const char* step) {
    ASSERT_NE(bytes, nullptr) << step;
    EXPECT_EQ(std::string(bytes, 4096), ValueFor(key, 4096)) << step << ": a viewed object's bytes changed";
    EXPECT_EQ(Get(key), ValueFor(key, 4096)) << step << ": a viewed object was evicted";
  }
};

TEST_F(PinTablesTest, EveryWayATableBecomesLiveKeepsItsViewsThroughEviction) {
  // 1. Attach: a live client's view.
  ClientRef c = Attach();
  Put(c, "attached", 4096);
  const char* attached = View(c, "attached", 0);
  ClientRef other = Attach("client:2");
  FillFrom(other, "fill1/");
  ExpectIntact("attached", attached, "attach");

  // 2. Retire at detach: the client closes with its view alive.
  Put(c, "detached", 4096);
  const char* detached = View(c, "detached", 1);
  uint32_t conn = c.slot;  // c's own connection
  ASSERT_EQ(StatusOf(Call(MessageType::kDetach, Enc(c), &conn)), ErrorCode::OK);
  ASSERT_NE(master_->pool().client_slot(c.slot)->generation.load() & kSlotRetired, 0u);
  FillFrom(other, "fill2/");
  ExpectIntact("attached", attached, "retire at detach");
  ExpectIntact("detached", detached, "retire at detach");

  // 3. Retire at recovery: the master restarts while the views live.
  config_.format = false;
  StartMaster();
  ASSERT_NE(master_->pool().client_slot(c.slot)->generation.load() & kSlotRetired, 0u);
  ClientRef other2 = Attach("client:3");
  ASSERT_NE(other2.slot, c.slot);
  FillFrom(other2, "fill3/");
  ExpectIntact("attached", attached, "retire at recovery");
  ExpectIntact("detached", detached, "retire at recovery");

  // 4. Re-attach: the owner takes its retired slot back, views with it.
  AttachRequest req = AttachRequestFor("client:1");
  req.prev_slot = c.slot;
  req.prev_generation = c.generation;
  uint32_t fresh = Master::kNoSlot;  // a new connection
  AttachReply back = AttachWith(req, &fresh);
  ASSERT_EQ(back.status, ErrorCode::OK);
  ASSERT_EQ(back.slot, c.slot);
  FillFrom(other2, "fill4/");
  ExpectIntact("attached", attached, "re-attach");
  ExpectIntact("detached", detached, "re-attach");
}

}  // namespace
}  // namespace mcxl
