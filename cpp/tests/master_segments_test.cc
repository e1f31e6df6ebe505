// DRAM segments as the master sees them (master_segments.cc): an Attach's
// segment is adopted or refused by its size; placement by
// prefer_alloc_in_same_node and preferred_segment; the pool keeps a
// SegmentStub; the owner publishes kInSegment; a detach unlinks the
// segment's objects; a segment extent is reused after a remove; a restart
// drops a segment object and the older values of its key; of many owners,
// a dead one's reclaim drops its objects only; kSegmentSession names a live
// attachment's session and size, and nothing for an ended one.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "test_util/master_fixture.h"

namespace mcxl {
namespace {

using testutil::Enc;
using testutil::kMiB;
using testutil::StatusOf;

class MasterSegmentsTest : public testutil::StartedMasterFixture {
 protected:
  ClientRef AttachWithSegment(const std::string& name, uint64_t size) {
    AttachRequest req = AttachRequestFor(name);
    req.segment_size = size;
    return Attach(req);
  }
  PutStartItem PutStartPlaced(const ClientRef& c, const std::string& key, uint64_t size, uint8_t placement,
                              const std::string& preferred = "", bool upsert = false) {
    PutStartRequest req;
    req.upsert = upsert;
    req.client = c;
    conn_slot_ = c.slot;
    req.keys = {key};
    req.sizes = {size};
    req.groups = {""};
    req.placement = uint8_t(kPlaceSegment | placement | (preferred.empty() ? 0 : kPlaceNamed));
    req.preferred_segment = preferred;
    PutStartReply r = CallFor<PutStartReply>(MessageType::kPutStart, Enc(req));
    EXPECT_EQ(r.items.size(), 1u);
    return r.items.empty() ? PutStartItem{} : r.items[0];
  }
  SegmentStub StubOf(const std::string& key) {
    auto s = index_->FindComplete(key, KeyHash(key));
    EXPECT_TRUE(s.ok());
    const SegmentStub* p = s.ok() ? index_->SegmentStubPtr(*s, key) : nullptr;
    EXPECT_NE(p, nullptr);
    SegmentStub out{};
    if (p != nullptr) memcpy(&out, p, sizeof(out));
    return out;
  }
};

TEST_F(MasterSegmentsTest, SameNodePutGoesToTheSegmentWithAStubInThePool) {
  ClientRef c = AttachWithSegment("seg:1", 4 * kMiB);
  PutStartItem it = PutStartPlaced(c, "k", 100000, kPlaceSameNode);
  ASSERT_EQ(it.status, ErrorCode::OK);
  EXPECT_EQ(it.segment_slot, c.slot);
  EXPECT_EQ(it.segment_generation, c.generation);
  EXPECT_LE(it.value_offset + 100000, 4 * kMiB);
  ASSERT_TRUE(index_->PublishComplete(it.entry_slot, it.generation, EntryState::kInSegment));
  master_->Tick();
  SegmentStub st = StubOf("k");
  EXPECT_EQ(st.magic, kSegmentStubMagic);
  EXPECT_EQ(st.slot, c.slot);
  EXPECT_EQ(st.slot_generation, c.generation);
  EXPECT_EQ(st.offset, it.value_offset);
  EXPECT_GE(st.length, 100000u);
  EXPECT_EQ(master_->stats().complete_keys, 1u);
  // The same put by name; a name that is not this client's goes to the pool.
  PutStartItem named = PutStartPlaced(c, "named", 5000, 0, "seg:1");
  EXPECT_EQ(named.segment_generation, c.generation);
  PutStartItem other = PutStartPlaced(c, "other", 5000, 0, "someone:2");
  EXPECT_EQ(other.segment_generation, 0u);
  EXPECT_TRUE(master_->pool().InDataRegion(other.value_offset, 5000));
}

TEST_F(MasterSegmentsTest, SegmentSessionNamesALiveOwnersSessionOnly) {
  AttachRequest req = AttachRequestFor("seg:1");
  req.segment_size = 4 * kMiB;
  req.segment_session = "127.0.0.1:15123";
  ClientRef owner = Attach(req);
  ClientRef plain = AttachWithSegment("seg:2", 4 * kMiB);  // a segment nobody else can read
  ClientRef reader = Attach(AttachRequestFor("reader:3"));
  auto ask = [&](uint32_t slot, uint64_t generation) {
    conn_slot_ = reader.slot;
    return CallFor<SegmentSessionReply>(MessageType::kSegmentSession,
                                        Enc(SegmentSessionRequest{reader, slot, generation}));
  };
  SegmentSessionReply r = ask(owner.slot, owner.generation);
  EXPECT_EQ(r.status, ErrorCode::OK);
  EXPECT_EQ(r.session, "127.0.0.1:15123");
  EXPECT_EQ(r.segment_size, 4 * kMiB);
  EXPECT_EQ(ask(owner.slot, owner.generation + 1).status, ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(ask(plain.slot, plain.generation).status, ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(ask(reader.slot, reader.generation).status, ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(ask(1u << 30, 1).status, ErrorCode::OBJECT_NOT_FOUND);
  conn_slot_ = owner.slot;
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(owner))), ErrorCode::OK);
  r = ask(owner.slot, owner.generation);
  EXPECT_EQ(r.status, ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_TRUE(r.session.empty());
}

TEST_F(MasterSegmentsTest, WithoutASegmentEveryPutGoesToThePool) {
  ClientRef c = Attach("plain:1");
  PutStartItem it = PutStartPlaced(c, "k", 4096, kPlaceSameNode, "plain:1");
  ASSERT_EQ(it.status, ErrorCode::OK);
  EXPECT_EQ(it.segment_generation, 0u);
  // A segment size past the bound is refused at Attach: the client runs on the pool.
  ClientRef big = AttachWithSegment("big:1", 2ull << 40);
  PutStartItem b = PutStartPlaced(big, "b", 4096, kPlaceSameNode);
  ASSERT_EQ(b.status, ErrorCode::OK);
  EXPECT_EQ(b.segment_generation, 0u);
}

TEST_F(MasterSegmentsTest, DetachUnlinksTheSegmentObjectsAndRemoveFreesTheExtent) {
  ClientRef c = AttachWithSegment("seg:1", 1 * kMiB);
  PutStartItem a = PutStartPlaced(c, "a", 600000, kPlaceSameNode);
  ASSERT_EQ(a.segment_generation, c.generation);
  ASSERT_TRUE(index_->PublishComplete(a.entry_slot, a.generation, EntryState::kInSegment));
  master_->Tick();
  // The segment is full: the next one goes to the pool (a is read-leased: kept).
  index_->ExtendLease(a.entry_slot, NowNs() + 60ull * 1000000000ull);
  PutStartItem b = PutStartPlaced(c, "b", 600000, kPlaceSameNode);
  EXPECT_EQ(b.segment_generation, 0u);
  // Removed, its extent is free again for the next segment put.
  EXPECT_EQ(Remove("a", true), ErrorCode::OK);
  PutStartItem again = PutStartPlaced(c, "again", 600000, kPlaceSameNode);
  ASSERT_EQ(again.segment_generation, c.generation);
  ASSERT_TRUE(index_->PublishComplete(again.entry_slot, again.generation, EntryState::kInSegment));
  master_->Tick();
  EXPECT_TRUE(Found("again"));
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(c))), ErrorCode::OK);
  EXPECT_FALSE(Found("again"));  // died with its client
  EXPECT_EQ(master_->stats().complete_keys, 0u);
}

}  // namespace
}  // namespace mcxl

namespace mcxl {
namespace {

TEST_F(MasterSegmentsTest, RestartDropsAnUnsettledUpsertInASegmentAndTheOlderValueOfItsKey) {
  // An upsert into the segment caught mid-flight: the pool value and the
  // segment value are both readable, the master never ticked. The restarted
  // master drops the segment object; the older pool value must not come
  // back as the key's value (a miss is safe, an older value is not).
  ClientRef c = AttachWithSegment("seg:1", 4 * kMiB);
  PutStartItem old = PutStartPlaced(c, "k", 4096, 0);
  ASSERT_EQ(old.segment_generation, 0u);
  ASSERT_TRUE(index_->PublishComplete(old.entry_slot, old.generation));
  PutStartItem kept = PutStartPlaced(c, "other", 4096, 0);
  ASSERT_TRUE(index_->PublishComplete(kept.entry_slot, kept.generation));
  master_->Tick();
  PutStartItem up = PutStartPlaced(c, "k", 4096, kPlaceSameNode, "", /*upsert=*/true);
  ASSERT_EQ(up.segment_generation, c.generation);
  ASSERT_TRUE(index_->PublishComplete(up.entry_slot, up.generation, EntryState::kInSegment));
  config_.format = false;
  StartMaster();
  EXPECT_FALSE(Found("k"));
  EXPECT_TRUE(Found("other"));
  EXPECT_EQ(master_->stats().complete_keys, 1u);
}

}  // namespace
}  // namespace mcxl

namespace mcxl {
namespace {

TEST_F(MasterSegmentsTest, ReclaimOfADeadOwnerDropsItsSegmentObjectsOnly) {
  // Many owners, each with objects in its segment; one owner's process
  // dies and the master's client check reclaims it: its objects are misses,
  // every other owner's stay readable (and their segments usable).
  constexpr int kOwners = 8, kPerOwner = 5, kDying = 3;
  pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  std::vector<ClientRef> owners;
  for (int o = 0; o < kOwners; ++o) {
    std::string name = "seg:" + std::to_string(o);
    AttachRequest req = AttachRequestFor(name, o == kDying ? uint64_t(child) : uint64_t(getpid()));
    req.segment_size = 4 * kMiB;
    owners.push_back(Attach(req));
    for (int k = 0; k < kPerOwner; ++k) {
      PutStartItem it = PutStartPlaced(owners[o], name + "/" + std::to_string(k), 8192, kPlaceSameNode);
      ASSERT_EQ(it.segment_generation, owners[o].generation);
      ASSERT_TRUE(index_->PublishComplete(it.entry_slot, it.generation, EntryState::kInSegment));
    }
  }
  master_->Tick();
  ASSERT_EQ(master_->stats().complete_keys, uint64_t(kOwners * kPerOwner));
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // The client check (every kClientCheckIntervalNs of Ticks) finds the
  // owner's process gone: waited for as a condition, bounded.
  std::string first = "seg:" + std::to_string(kDying) + "/0";
  for (uint64_t until = MonoNs() + 10000000000ull; Found(first) && MonoNs() < until;) {
    master_->Tick();
    usleep(1000);
  }
  for (int o = 0; o < kOwners; ++o)
    for (int k = 0; k < kPerOwner; ++k)
      EXPECT_EQ(Found("seg:" + std::to_string(o) + "/" + std::to_string(k)), o != kDying) << o << "/" << k;
  EXPECT_EQ(master_->stats().complete_keys, uint64_t((kOwners - 1) * kPerOwner));
  // A survivor's segment still takes puts; its older objects stay.
  PutStartItem more = PutStartPlaced(owners[0], "seg:0/more", 8192, kPlaceSameNode);
  EXPECT_EQ(more.segment_generation, owners[0].generation);
  EXPECT_TRUE(Found("seg:0/0"));
}

}  // namespace
}  // namespace mcxl
