// Master, in process, driven through Handle() with encoded payloads on a
// /dev/shm pool: attach/detach, PutStart + client-side publish + Tick,
// duplicate puts, upsert, Remove / BatchRemove / RemoveAll / RemoveByRegex,
// leases, malformed payloads of every request type and unknown types, the
// index load limit, eviction, requests that must not stall the master, and
// the serving process's session file (DropDeadTeSession).
// Restarts and views: master_recovery_test.cc.
#include "mooncake_cxl/master/master.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/control/shm_ring.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "test_util/master_fixture.h"

namespace mcxl {
namespace {

using testutil::Enc;
using testutil::kMiB;
using testutil::StatusOf;
using testutil::ValueFor;

class MasterTest : public testutil::StartedMasterFixture {};

TEST_F(MasterTest, AttachGivesSlotsAndPoolIdentity) {
  AttachRequest req = AttachRequestFor("c:1");
  AttachReply reply = AttachWith(req);
  EXPECT_EQ(reply.status, ErrorCode::OK);
  EXPECT_EQ(reply.slot, 0u);
  EXPECT_EQ(conn_slot_, 0u);
  EXPECT_EQ(reply.pool_path, config_.cxl_path);
  EXPECT_EQ(reply.pool_size, 64 * kMiB);
  EXPECT_EQ(memcmp(reply.uuid, master_->pool().superblock()->uuid, 16), 0);
  EXPECT_EQ(reply.lease_ttl_ms, config_.default_kv_lease_ttl_ms);
  EXPECT_EQ(master_->pool().client_slot(0)->generation.load(), reply.slot_generation);
  ClientRef second = Attach("c:2");
  EXPECT_EQ(second.slot, 1u);
  EXPECT_EQ(master_->stats().attached_clients, 2u);
  // Re-attach with the previous identity keeps the slot and generation.
  req.prev_slot = reply.slot;
  req.prev_generation = reply.slot_generation;
  auto again = CallFor<AttachReply>(MessageType::kAttach, Enc(req));
  EXPECT_EQ(again.slot, reply.slot);
  EXPECT_EQ(again.slot_generation, reply.slot_generation);
  EXPECT_EQ(StatusOf(Call(MessageType::kHeartbeat, Enc(ClientRef{0, reply.slot_generation}))),
            ErrorCode::OK);
  auto ping = CallFor<PingReply>(MessageType::kPing, "");
  EXPECT_EQ(ping.incarnation, reply.incarnation);
}

TEST_F(MasterTest, ClientSlotsRunOut) {
  config_.client_slots = 2;
  StartMaster();
  Attach("a");
  Attach("b");
  EXPECT_EQ(AttachWith(AttachRequestFor("c")).status, ErrorCode::NO_AVAILABLE_HANDLE);
}

TEST_F(MasterTest, PutPublishTickThenReadable) {
  ClientRef c = Attach();
  PutStartReply r = PutStart(c, {"k1"}, {1000});
  ASSERT_EQ(r.status, ErrorCode::OK);
  ASSERT_EQ(r.items.size(), 1u);
  const PutStartItem& it = r.items[0];
  ASSERT_EQ(it.status, ErrorCode::OK);
  EXPECT_EQ(it.value_offset % 64, 0u);
  EXPECT_TRUE(master_->pool().InDataRegion(it.value_offset, 1000));
  EXPECT_EQ(master_->stats().pending_puts, 1u);
  EXPECT_EQ(Get("k1"), "");  // WRITING: invisible
  std::string value = ValueFor("k1", 1000);
  WriteAndPublish(it, value);
  EXPECT_EQ(Get("k1"), value);  // readers need no master round trip
  master_->Tick();
  MasterStats st = master_->stats();
  EXPECT_EQ(st.pending_puts, 0u);
  EXPECT_EQ(st.complete_keys, 1u);
  EXPECT_EQ(st.put_requests, 1u);
  EXPECT_GE(st.allocated_bytes, 1000u);
}

TEST_F(MasterTest, BatchPutWithBadItems) {
  ClientRef c = Attach();
  PutStartReply r = PutStart(c, {"a", "", "b", "c"}, {10, 10, 0, ~uint64_t(0) - 8});
  ASSERT_EQ(r.status, ErrorCode::OK);
  ASSERT_EQ(r.items.size(), 4u);
  EXPECT_EQ(r.items[0].status, ErrorCode::OK);
  EXPECT_EQ(r.items[1].status, ErrorCode::INVALID_PARAMS);  // empty key
  EXPECT_EQ(r.items[2].status, ErrorCode::INVALID_PARAMS);  // empty value
  EXPECT_EQ(r.items[3].status, ErrorCode::NO_AVAILABLE_HANDLE);  // can never fit
  PutStartReply big = PutStart(c, {"big"}, {128 * kMiB});
  ASSERT_EQ(big.items.size(), 1u);
  EXPECT_EQ(big.items[0].status, ErrorCode::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(master_->stats().pending_puts, 1u);
}

TEST_F(MasterTest, PutWithStaleClientIsRefused) {
  ClientRef c = Attach();
  PutStartReply r = PutStart({c.slot, c.generation + 1}, {"k"}, {10});
  EXPECT_EQ(r.status, ErrorCode::ILLEGAL_CLIENT);
  EXPECT_TRUE(r.items.empty());
  r = PutStart({999, c.generation}, {"k"}, {10});
  EXPECT_EQ(r.status, ErrorCode::ILLEGAL_CLIENT);
}

TEST_F(MasterTest, DuplicatePutKeepsFirstValue) {
  ClientRef c = Attach();
  PutStartReply first = PutStart(c, {"dup"}, {100});
  ASSERT_EQ(first.items.size(), 1u);
  // Still WRITING: a second put already conflicts.
  PutStartReply during = PutStart(c, {"dup"}, {200});
  ASSERT_EQ(during.items.size(), 1u);
  EXPECT_EQ(during.items[0].status, ErrorCode::OBJECT_ALREADY_EXISTS);
  WriteAndPublish(first.items[0], ValueFor("dup", 100));
  master_->Tick();
  PutStartReply after = PutStart(c, {"dup"}, {300});
  ASSERT_EQ(after.items.size(), 1u);
  EXPECT_EQ(after.items[0].status, ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(Get("dup"), ValueFor("dup", 100));
  MasterStats st = master_->stats();
  EXPECT_EQ(st.put_failures, 0u);  // an existing key is not a failure
  EXPECT_EQ(st.complete_keys, 1u);
}

TEST_F(MasterTest, UpsertReplacesValue) {
  ClientRef c = Attach();
  Put(c, "u", 100);
  uint64_t used = master_->stats().allocated_bytes;
  PutStartReply r = PutStart(c, {"u"}, {5000}, /*upsert=*/true);
  ASSERT_EQ(r.items.size(), 1u);
  ASSERT_EQ(r.items[0].status, ErrorCode::OK);
  EXPECT_EQ(Get("u"), ValueFor("u", 100));  // old value until the new one is published
  std::string v2(5000, 'z');
  WriteAndPublish(r.items[0], v2);
  EXPECT_EQ(Get("u"), v2);  // newest generation wins even before Tick
  master_->Tick();
  EXPECT_EQ(Get("u"), v2);
  MasterStats st = master_->stats();
  EXPECT_EQ(st.complete_keys, 1u);
  EXPECT_GT(st.allocated_bytes, used);  // the old extent was freed, the new is larger
  EXPECT_LT(st.allocated_bytes, used + 5000 + 128);
  auto s = index_->FindComplete("u", KeyHash("u"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->flags & kFlagSuperseded, 0u);
}

TEST_F(MasterTest, AbortedPutIsReclaimed) {
  ClientRef c = Attach();
  PutStartReply r = PutStart(c, {"ab"}, {4096});
  ASSERT_EQ(r.items.size(), 1u);
  EXPECT_GT(master_->stats().allocated_bytes, 0u);
  ASSERT_TRUE(index_->Abort(r.items[0].entry_slot, r.items[0].generation));
  master_->Tick();
  MasterStats st = master_->stats();
  EXPECT_EQ(st.pending_puts, 0u);
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.complete_keys, 0u);
  Put(c, "ab", 10);  // the key is free again
  EXPECT_EQ(Get("ab"), ValueFor("ab", 10));
}

TEST_F(MasterTest, RemoveVariants) {
  ClientRef c = Attach();
  for (const char* k : {"a/1", "a/2", "b/1", "b/2", "c/1"}) Put(c, k, 256);
  EXPECT_EQ(master_->stats().complete_keys, 5u);

  EXPECT_EQ(Remove("a/1"), ErrorCode::OK);
  EXPECT_EQ(Get("a/1"), "");
  EXPECT_EQ(Remove("a/1"), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(Remove(""), ErrorCode::INVALID_PARAMS);

  PutStartReply pending = PutStart(c, {"w"}, {10});  // WRITING only
  EXPECT_EQ(Remove("w"), ErrorCode::REPLICA_IS_NOT_READY);

  auto br = CallFor<RemoveReply>(MessageType::kBatchRemove,
                                 Enc(RemoveRequest{Conn(), {"a/2", "nope", "b/1"}, false}));
  EXPECT_EQ(br.status, ErrorCode::OK);
  EXPECT_EQ(br.results, (std::vector<int32_t>{0, ToInt(ErrorCode::OBJECT_NOT_FOUND), 0}));
  EXPECT_EQ(Get("a/2"), "");
  EXPECT_EQ(Get("b/2"), ValueFor("b/2", 256));

  // kRemove takes exactly one key.
  EXPECT_EQ(StatusOf(Call(MessageType::kRemove, Enc(RemoveRequest{Conn(), {"b/2", "c/1"}, false}))),
            ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(Get("b/2"), ValueFor("b/2", 256));

  CountReply bad = RemoveMatching(MessageType::kRemoveByRegex, "([", false);
  EXPECT_EQ(bad.status, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(bad.count, 0u);
  EXPECT_EQ(master_->stats().complete_keys, 2u);

  CountReply rx = RemoveMatching(MessageType::kRemoveByRegex, "^b/", false);
  EXPECT_EQ(rx.status, ErrorCode::OK);
  EXPECT_EQ(rx.count, 1u);
  EXPECT_EQ(Get("b/2"), "");
  EXPECT_EQ(Get("c/1"), ValueFor("c/1", 256));

  WriteAndPublish(pending.items[0], ValueFor("w", 10));
  master_->Tick();
  CountReply all = RemoveMatching(MessageType::kRemoveAll, "", false);
  EXPECT_EQ(all.status, ErrorCode::OK);
  EXPECT_EQ(all.count, 2u);
  MasterStats st = master_->stats();
  EXPECT_EQ(st.complete_keys, 0u);
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.pending_puts, 0u);
}

TEST_F(MasterTest, LeaseBlocksNonForcedRemove) {
  ClientRef c = Attach();
  PutStartItem it = Put(c, "leased", 64);
  Put(c, "free", 64);
  index_->ExtendLease(it.entry_slot, NowNs() + 60 * 1000000000ull);  // what a get does
  EXPECT_EQ(Remove("leased"), ErrorCode::OBJECT_HAS_LEASE);
  EXPECT_EQ(Get("leased"), ValueFor("leased", 64));
  CountReply rx = RemoveMatching(MessageType::kRemoveByRegex, ".*", false);
  EXPECT_EQ(rx.count, 1u);  // only "free"
  CountReply all = RemoveMatching(MessageType::kRemoveAll, "", false);
  EXPECT_EQ(all.count, 0u);
  EXPECT_EQ(Get("leased"), ValueFor("leased", 64));
  EXPECT_EQ(Remove("leased", /*force=*/true), ErrorCode::OK);
  EXPECT_EQ(Get("leased"), "");
  // An expired lease does not block.
  PutStartItem it2 = Put(c, "expired", 64);
  index_->ExtendLease(it2.entry_slot, NowNs() - 1000000000ull);
  EXPECT_EQ(Remove("expired"), ErrorCode::OK);
}

TEST_F(MasterTest, MalformedPayloadsGetInvalidParams) {
  ClientRef c = Attach();
  Put(c, "keep", 128);
  MasterStats before = master_->stats();

  PutStartRequest put;
  put.client = c;
  put.keys = {"k"};
  put.sizes = {10};
  const struct {
    MessageType type;
    std::string valid;
  } cases[] = {
      {MessageType::kAttach, Enc(AttachRequest{"h", "m", 1, 0, 0})},
      {MessageType::kDetach, Enc(c)},
      {MessageType::kHeartbeat, Enc(c)},
      {MessageType::kPutStart, Enc(put)},
      {MessageType::kRemove, Enc(RemoveRequest{c, {"keep"}, true})},
      {MessageType::kBatchRemove, Enc(RemoveRequest{c, {"keep"}, true})},
      {MessageType::kRemoveByRegex, Enc(RemoveByRegexRequest{c, ".*", true})},
      {MessageType::kRemoveAll, Enc(RemoveByRegexRequest{c, "", true})},
  };
  for (const auto& cs : cases) {
    SCOPED_TRACE(MessageTypeName(uint16_t(cs.type)));
    // Every truncation, trailing garbage, and an absurd count.
    for (size_t n = 0; n < cs.valid.size(); ++n)
      EXPECT_EQ(StatusOf(Call(cs.type, cs.valid.substr(0, n))), ErrorCode::INVALID_PARAMS) << n;
    EXPECT_EQ(StatusOf(Call(cs.type, cs.valid + '\x01')), ErrorCode::INVALID_PARAMS);
    // (Naming slot 0xffffffff: refused unread, as not this connection's client.)
    EXPECT_EQ(StatusOf(Call(cs.type, std::string(64, '\xff'))),
              cs.type == MessageType::kAttach ? ErrorCode::INVALID_PARAMS : ErrorCode::ILLEGAL_CLIENT);
  }
  for (uint16_t type : {uint16_t(MessageType::kError), uint16_t(11), uint16_t(999), uint16_t(0xffff)})
    EXPECT_EQ(StatusOf(master_->Handle(type, "abc", &conn_slot_)), ErrorCode::INVALID_PARAMS) << type;

  // Nothing changed, and the master still works.
  MasterStats after = master_->stats();
  EXPECT_EQ(after.complete_keys, before.complete_keys);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.pending_puts, 0u);
  EXPECT_EQ(after.attached_clients, 1u);
  EXPECT_EQ(Get("keep"), ValueFor("keep", 128));
  EXPECT_EQ(StatusOf(Call(MessageType::kHeartbeat, Enc(c))), ErrorCode::OK);
}

TEST_F(MasterTest, IndexLoadLimitRefusesPuts) {
  config_.index_capacity = 1024;
  StartMaster();
  ClientRef c = Attach();
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 1000; ++i) {
    keys.emplace_back("k");
    keys.back() += std::to_string(i);  // not "k" + ...: GCC 12 -Wrestrict false positive
    sizes.push_back(64);
  }
  PutStartReply r = PutStart(c, keys, sizes);
  ASSERT_EQ(r.items.size(), keys.size());
  size_t ok = 0;
  for (const auto& it : r.items) {
    // All are unfinished puts (nothing evictable): "no room now, retry".
    if (it.status == ErrorCode::OK) ++ok;
    else EXPECT_EQ(it.status, ErrorCode::OBJECT_REPLICA_BUSY);
  }
  EXPECT_EQ(ok, uint64_t(0.8 * 1024));  // --index_high_watermark_ratio
}

TEST_F(MasterTest, DetachReclaimsSlotAndRevokesPuts) {
  ClientRef c = Attach();
  Put(c, "done", 64);
  PutStartReply r = PutStart(c, {"unfinished"}, {64});
  ASSERT_EQ(r.items.size(), 1u);
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(c))), ErrorCode::OK);
  EXPECT_EQ(conn_slot_, Master::kNoSlot);
  MasterStats st = master_->stats();
  EXPECT_EQ(st.attached_clients, 0u);
  EXPECT_EQ(st.pending_puts, 0u);
  EXPECT_EQ(st.revoked_puts, 1u);
  EXPECT_EQ(master_->pool().client_slot(c.slot)->generation.load(), 0u);
  // The unfinished put can no longer be published; the finished one stays.
  EXPECT_FALSE(index_->PublishComplete(r.items[0].entry_slot, r.items[0].generation));
  EXPECT_EQ(Get("unfinished"), "");
  EXPECT_EQ(Get("done"), ValueFor("done", 64));
  // The old identity is dead; the slot is handed out again.
  EXPECT_EQ(StatusOf(Call(MessageType::kHeartbeat, Enc(c))), ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(c))), ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(PutStart(c, {"x"}, {1}).status, ErrorCode::ILLEGAL_CLIENT);
  ClientRef again = Attach();
  EXPECT_EQ(again.slot, c.slot);
  EXPECT_NE(again.generation, c.generation);
  Put(again, "unfinished", 64);
  EXPECT_EQ(Get("unfinished"), ValueFor("unfinished", 64));
}

TEST_F(MasterTest, SlotInsideARingCallIsRetiredNotHandedOn) {
  // A process stopped inside a ring call (caller word held) could resume
  // mid-push: its slot must not reach another client until it is out.
  ClientRef c = Attach();
  uint32_t ring_bytes = master_->pool().geometry().ring_bytes;
  ShmRing requests(master_->pool().ring(c.slot, 0), ring_bytes);
  ASSERT_TRUE(requests.ClaimCaller(c.generation));
  EXPECT_FALSE(requests.ClaimCaller(c.generation - 1));  // an older attachment yields
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(c))), ErrorCode::OK);
  EXPECT_EQ(master_->pool().client_slot(c.slot)->generation.load() & ~kSlotRetired, c.generation);
  ClientRef other = Attach("client:2");
  EXPECT_NE(other.slot, c.slot);
  requests.ReleaseCaller(c.generation);
  master_->Tick();  // the retired slot is released once its call is over
  EXPECT_EQ(master_->pool().client_slot(c.slot)->generation.load(), 0u);
  ClientRef third = Attach("client:3");
  EXPECT_EQ(third.slot, c.slot);
  // The new attachment takes the word over from a late claim of an older one.
  ShmRing again(master_->pool().ring(third.slot, 0), ring_bytes);
  ASSERT_TRUE(again.ClaimCaller(c.generation));
  EXPECT_TRUE(again.ClaimCaller(third.generation));
  EXPECT_FALSE(again.ClaimCaller(c.generation));
  again.ReleaseCaller(c.generation);  // not the holder: no effect
  EXPECT_EQ(ShmRing::CallerOf(master_->pool().ring(third.slot, 0)), third.generation);
}

// A put published and then removed before the master's next Tick (a put
// at once followed by a remove over TCP) is still pending when the remove
// unlinks it: complete_keys must not underflow, and a later revoke of the
// pending put (Detach here, put_start_discard_timeout_sec otherwise) must
// not unlink or free it a second time, when its extent already belongs to
// another object.
TEST_F(MasterTest, RemoveBeforeTickDoesNotDoubleFree) {
  ClientRef c = Attach();
  PutStartReply a = PutStart(c, {"a"}, {4096});
  ASSERT_EQ(a.items.size(), 1u);
  WriteAndPublish(a.items[0], ValueFor("a", 4096));
  ASSERT_EQ(Remove("a"), ErrorCode::OK);  // before any Tick
  EXPECT_EQ(master_->stats().complete_keys, 0u) << "complete_keys underflowed";
  ClientRef other = Attach("other");
  Put(other, "b", 4096);  // reuses a's extent
  ASSERT_EQ(Get("b"), ValueFor("b", 4096));
  uint64_t used = master_->stats().allocated_bytes;
  conn_slot_ = c.slot;  // c's connection
  ASSERT_EQ(StatusOf(Call(MessageType::kDetach, Enc(c))), ErrorCode::OK);
  master_->Tick();
  EXPECT_EQ(master_->stats().allocated_bytes, used) << "b's extent was freed under it";
  EXPECT_EQ(master_->stats().complete_keys, 1u);
  Put(other, "c", 4096);  // would land on b's extent
  EXPECT_TRUE(Get("b") == ValueFor("b", 4096)) << "b was overwritten by c";
}

// Eviction (master_eviction.cc) never takes an unfinished put, and a group
// goes whole or not at all, also when the pool has to make room at once.
TEST_F(MasterTest, EvictionSkipsUnfinishedPutsAndKeepsGroupsWhole) {
  config_.cxl_size = 16 * kMiB;
  StartMaster();
  ClientRef c = Attach();
  PutStartReply unfinished = PutStart(c, {"writing"}, {kMiB});
  ASSERT_EQ(unfinished.items.at(0).status, ErrorCode::OK);
  PutStartRequest grouped;
  grouped.client = c;
  grouped.keys = {"g/k", "g/v"};
  grouped.sizes = {kMiB, kMiB};
  grouped.groups = {"g", "g"};
  auto gr = CallFor<PutStartReply>(MessageType::kPutStart, Enc(grouped));
  for (const auto& it : gr.items) WriteAndPublish(it, std::string(kMiB, 'g'));
  master_->Tick();
  for (int i = 0; i < 40; ++i) Put(c, "filler" + std::to_string(i), kMiB);  // 2.5x the pool
  MasterStats st = master_->stats();
  EXPECT_GT(st.evicted_keys, 0u);
  EXPECT_EQ(Get("g/k").empty(), Get("g/v").empty()) << "group split by eviction";
  // The unfinished put kept its extent: its client can still complete it.
  WriteAndPublish(unfinished.items[0], ValueFor("writing", kMiB));
  EXPECT_EQ(Get("writing"), ValueFor("writing", kMiB));
}

// ---- The newest generation is the key's value for eviction and removal,
// also before Tick settles the upsert.

// A reader's lease for the next hour.
static void LeaseEntry(ObjectIndex* index, uint64_t slot) { index->ExtendLease(slot, NowNs() + 3600ull * 1000000000ull); }

TEST_F(MasterTest, EvictingAnUnsettledUpsertTakesTheOlderValueAlong) {
  config_.cxl_size = 16 * kMiB;
  StartMaster();
  ClientRef c = Attach();
  PutStartItem old = Put(c, "k", kMiB);
  LeaseEntry(index_.get(), old.entry_slot);  // a reader holds the old value
  for (int i = 0;; ++i) {  // leased fillers up to the high watermark
    if (master_->stats().allocated_bytes + 2 * (kMiB + 128) > 0.9 * master_->stats().capacity_bytes) break;
    LeaseEntry(index_.get(), Put(c, "fill" + std::to_string(i), kMiB).entry_slot);
  }
  PutStartReply up = PutStart(c, {"k"}, {kMiB}, /*upsert=*/true);
  ASSERT_EQ(up.items.at(0).status, ErrorCode::OK);
  WriteAndPublish(up.items[0], std::string(kMiB, 'N'));  // acknowledged; no Tick yet
  ASSERT_EQ(Get("k"), std::string(kMiB, 'N'));
  // The next put evicts: the new value is the only unleased object.
  PutStartReply next = PutStart(c, {"next"}, {kMiB});
  ASSERT_EQ(next.items.at(0).status, ErrorCode::OK);
  EXPECT_GE(master_->stats().evicted_keys, 2u);
  EXPECT_EQ(Get("k"), "") << "eviction brought the old value back";
  WriteAndPublish(next.items[0], ValueFor("next", kMiB));
  master_->Tick();
  EXPECT_EQ(Get("k"), "");
}

TEST_F(MasterTest, EvictionWaitsForAnOlderUpsertStillWriting) {
  config_.cxl_size = 16 * kMiB;
  StartMaster();
  ClientRef c = Attach();
  LeaseEntry(index_.get(), Put(c, "k", kMiB).entry_slot);
  PutStartReply first = PutStart(c, {"k"}, {kMiB}, /*upsert=*/true);  // still writing
  ASSERT_EQ(first.items.at(0).status, ErrorCode::OK);
  PutStartReply second = PutStart(c, {"k"}, {kMiB}, /*upsert=*/true);
  ASSERT_EQ(second.items.at(0).status, ErrorCode::OK);
  WriteAndPublish(second.items[0], std::string(kMiB, '2'));
  for (int i = 0; i < 30; ++i) {  // churn: the pool overflows twice
    PutStartReply r = PutStart(c, {"churn" + std::to_string(i)}, {kMiB});
    if (r.items.at(0).status == ErrorCode::OK) WriteAndPublish(r.items[0], ValueFor("x", kMiB));
  }
  EXPECT_GT(master_->stats().evicted_keys, 0u);
  // Had the second upsert been evicted, publishing the first would make its
  // (older) value the key's.
  WriteAndPublish(first.items[0], std::string(kMiB, '1'));
  master_->Tick();
  EXPECT_EQ(Get("k"), std::string(kMiB, '2'));
}

TEST_F(MasterTest, RemoveOfAnUnsettledUpsertJudgesTheNewestValue) {
  ClientRef c = Attach();
  for (const char* key : {"r", "all"}) {
    LeaseEntry(index_.get(), Put(c, key, 100).entry_slot);  // the old value is leased
    PutStartReply up = PutStart(c, {key}, {200}, /*upsert=*/true);
    ASSERT_EQ(up.items.at(0).status, ErrorCode::OK);
    WriteAndPublish(up.items[0], std::string(200, 'n'));
  }
  EXPECT_EQ(Remove("r"), ErrorCode::OK);  // the current value is not leased
  EXPECT_EQ(Get("r"), "");
  EXPECT_EQ(RemoveMatching(MessageType::kRemoveAll, "", false).status, ErrorCode::OK);
  EXPECT_EQ(Get("all"), "") << "remove_all kept the old value of an upserted key";
  master_->Tick();
  EXPECT_EQ(master_->stats().allocated_bytes, 0u);
}

// ---- One request must not stall or crash the master.

TEST_F(MasterTest, RegexIsRe2LinearOverBytes) {
  ClientRef c = Attach();
  Put(c, std::string(20000, 'a'), 16);  // a recursive matcher would recurse once per character
  Put(c, std::string(28, 'a'), 16);     // a backtracking one would try ^(a|a)*b$ 2^28 ways
  Put(c, "\xc3\xa9/x", 16);             // two bytes, then "/x"
  EXPECT_EQ(RemoveMatching(MessageType::kRemoveByRegex, "^(a|a)*b$", false).count, 0u);
  EXPECT_EQ(RemoveMatching(MessageType::kRemoveByRegex, "(a)\\1", false).status, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(RemoveMatching(MessageType::kRemoveByRegex, "a(?=a)", false).status, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(RemoveMatching(MessageType::kRemoveByRegex, std::string(Master::kMaxPatternBytes + 1, 'a'), false)
                .status,
            ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(RemoveMatching(MessageType::kRemoveByRegex, "^../x$", false).count, 1u);  // '.' is one byte
  CountReply r = RemoveMatching(MessageType::kRemoveByRegex, "^(a|b)*$", false);
  EXPECT_EQ(r.status, ErrorCode::OK);
  EXPECT_EQ(r.count, 2u);
  EXPECT_EQ(master_->stats().complete_keys, 0u);
}

TEST_F(MasterTest, RemoveAllScansInSlicesAndRemovesEverything) {
  ClientRef c = Attach();
  const int n = int(Master::kScanSliceSlots) * 2 + 100;  // several slices
  for (int base = 0; base < n; base += 1000) {
    std::vector<std::string> keys;
    for (int i = base; i < std::min(n, base + 1000); ++i) keys.push_back("k/" + std::to_string(i));
    PutStartReply r = PutStart(c, keys, std::vector<uint64_t>(keys.size(), 8));
    ASSERT_EQ(r.status, ErrorCode::OK);
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(r.items[i].status, ErrorCode::OK) << keys[i];
      WriteAndPublish(r.items[i], ValueFor(keys[i], 8));
    }
  }
  master_->Tick();
  EXPECT_EQ(RemoveMatching(MessageType::kRemoveByRegex, "^k/1", false).count, 1111u);  // 1, 10-19, 100-199, 1000-1999
  EXPECT_EQ(RemoveMatching(MessageType::kRemoveAll, "", false).count, uint64_t(n) - 1111);
  EXPECT_EQ(master_->stats().complete_keys, 0u);
  EXPECT_EQ(master_->stats().allocated_bytes, 0u);
}

TEST_F(MasterTest, RingRefusesWholeIndexScansSoTheClientUsesTcp) {
  ClientRef c = Attach();
  Put(c, "r/1", 16);
  uint32_t ring_bytes = master_->pool().superblock()->ring_bytes;
  ShmRing requests(master_->pool().ring(c.slot, 0), ring_bytes), replies(master_->pool().ring(c.slot, 1), ring_bytes);
  ASSERT_TRUE(requests.Push(MakeFrame(MessageType::kRemoveAll, RingRequestId(c.generation, 42), Enc(RemoveByRegexRequest{c, "", true}))));
  master_->ServeRing(c.slot);
  std::string frame;
  ASSERT_EQ(replies.Pop(&frame), ShmRing::PopResult::kOk);
  FrameHeader h;
  ASSERT_GE(frame.size(), sizeof(h));
  memcpy(&h, frame.data(), sizeof(h));
  EXPECT_EQ(h.type, uint16_t(MessageType::kError));
  EXPECT_EQ(h.request_id, RingRequestId(c.generation, 42));
  EXPECT_EQ(StatusOf(frame.substr(sizeof(h))), ErrorCode::NOT_SUPPORTED);
  EXPECT_EQ(Get("r/1"), ValueFor("r/1", 16));  // nothing removed
}

TEST_F(MasterTest, PerRequestListsAreCappedAndAbandonedIdsHashed) {
  ClientRef c = Attach();
  PutStartRequest req;
  req.client = c;
  req.put_id = 7;
  req.keys = {"w"};
  req.sizes = {10};
  ASSERT_EQ(CallFor<PutStartReply>(MessageType::kPutStart, Enc(req)).items.at(0).status, ErrorCode::OK);
  // 400,000 abandoned ids: refused as a whole, at once.
  PutStartRequest big = req;
  big.put_id = 8;
  for (uint64_t i = 0; i < 400000; ++i) big.abandoned.push_back(1000 + i);
  uint64_t t0 = MonoNs();
  EXPECT_EQ(CallFor<PutStartReply>(MessageType::kPutStart, Enc(big)).status, ErrorCode::INVALID_PARAMS);
  EXPECT_LT(MonoNs() - t0, 5 * 1000000000ull);  // a hang guard, not a benchmark
  // kMaxAbandonedIds ids, one of them the unfinished put 7: it is revoked.
  PutStartRequest most = req;
  most.put_id = 9;
  most.keys = {"v"};
  for (uint64_t i = 0; i + 1 < kMaxAbandonedIds; ++i) most.abandoned.push_back(5000 + i);
  most.abandoned.push_back(7);
  EXPECT_EQ(CallFor<PutStartReply>(MessageType::kPutStart, Enc(most)).status, ErrorCode::OK);
  EXPECT_EQ(Remove("w"), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(CallFor<PutStartReply>(MessageType::kPutStart, Enc(req)).status, ErrorCode::RPC_TIMEOUT);  // late 7
  // Too many keys in one PutStart or BatchRemove.
  PutStartRequest many = req;
  many.put_id = 10;
  many.keys.clear();
  many.sizes.clear();
  for (uint32_t i = 0; i <= kMaxRequestKeys; ++i) {
    many.keys.push_back("m/" + std::to_string(i));
    many.sizes.push_back(8);
  }
  EXPECT_EQ(CallFor<PutStartReply>(MessageType::kPutStart, Enc(many)).status, ErrorCode::INVALID_PARAMS);
  RemoveRequest rm{c, many.keys, true};
  EXPECT_EQ(CallFor<RemoveReply>(MessageType::kBatchRemove, Enc(rm)).status, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(master_->stats().pending_puts, 1u);  // "v" only
}

// The serving process's session file: only a writer known gone loses it.
TEST(TeSessionFile, DroppedOnlyWhenItsWriterIsGone) {
  testutil::ShmDir dir("TeSessionFile");
  std::string path = dir.File("pool.te");
  auto write = [&](const std::string& text) {
    FILE* f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs(text.c_str(), f);
    fclose(f);
  };
  auto exists = [&] { return access(path.c_str(), F_OK) == 0; };
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: its pid is gone
  const std::string dead = std::to_string(child), live = std::to_string(getpid());
  EXPECT_FALSE(DropDeadTeSession(path));  // no file
  for (const char* unjudgeable : {"127.0.0.1:1\n", "127.0.0.1:1", "127.0.0.1:1\nx\n", "127.0.0.1:1\n0\n",
                                  "127.0.0.1:1\n99999999999\n"}) {
    write(unjudgeable);
    EXPECT_FALSE(DropDeadTeSession(path)) << unjudgeable;
    EXPECT_TRUE(exists()) << unjudgeable;
  }
  write("127.0.0.1:1\n" + live + "\n");
  EXPECT_FALSE(DropDeadTeSession(path));
  EXPECT_TRUE(exists());
  write("127.0.0.1:1\n" + dead + "\n");
  EXPECT_TRUE(DropDeadTeSession(path));
  EXPECT_FALSE(exists());
  EXPECT_FALSE(DropDeadTeSession(""));
}

}  // namespace
}  // namespace mcxl
