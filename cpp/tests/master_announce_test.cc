// The master's announcement channels (master_announce.cc) through Handle():
// names scoped by tenant, one channel per (tenant, name), bad names refused,
// the per-client cap and the pool-wide limit (NO_AVAILABLE_HANDLE, the
// master usable after), holds ended by close and by detach, a freed channel
// reused by another name only once needed and then wiped, and the holders'
// bits read back by a restarted master.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "mooncake_cxl/common/tenant.h"
#include "mooncake_cxl/control/announce.h"
#include "mooncake_cxl/master/master.h"
#include "test_util/master_fixture.h"

namespace mcxl {
namespace {

using testutil::Enc;
using testutil::StatusOf;

class MasterAnnounceTest : public testutil::MasterFixture {
 protected:
  struct Client {
    ClientRef ref;
    uint32_t conn = Master::kNoSlot;
  };
  Client AttachAs(const std::string& name, const std::string& tenant = "default") {
    Client c;
    AttachRequest req = AttachRequestFor(name);
    req.tenant = tenant;
    c.ref = Attach(req, &c.conn);
    return c;
  }
  AnnounceOpenReply Open(Client& c, const std::string& name) {
    return CallFor<AnnounceOpenReply>(MessageType::kAnnounceOpen, Enc(AnnounceOpenRequest{c.ref, name}), &c.conn);
  }
  ErrorCode Close(Client& c, const AnnounceOpenReply& r) {
    return StatusOf(Call(MessageType::kAnnounceClose, Enc(AnnounceCloseRequest{c.ref, r.channel, r.name_hash}),
                         &c.conn));
  }
  uint64_t PoolName(uint32_t ch) { return master_->pool().announce_channel(ch)->name_hash.load(); }
};

TEST_F(MasterAnnounceTest, NamesAreScopedByTenantAndBadNamesRefused) {
  StartMaster();
  Client a = AttachAs("a:1", "alpha"), b = AttachAs("b:1", "beta"), d = AttachAs("d:1");
  AnnounceOpenReply ra = Open(a, "prefill-0"), rb = Open(b, "prefill-0"), rd = Open(d, "prefill-0");
  ASSERT_EQ(ra.status, ErrorCode::OK);
  ASSERT_EQ(rb.status, ErrorCode::OK);
  ASSERT_EQ(rd.status, ErrorCode::OK);
  EXPECT_NE(ra.channel, rb.channel);
  EXPECT_NE(ra.channel, rd.channel);
  EXPECT_EQ(ra.name_hash, AnnounceNameHash(TenantPrefix("alpha") + "prefill-0"));
  EXPECT_EQ(rd.name_hash, AnnounceNameHash("prefill-0"));  // the default tenant's names are unchanged
  EXPECT_EQ(PoolName(ra.channel), ra.name_hash);
  AnnounceOpenReply again = Open(a, "prefill-0");  // the same tenant and name: the same channel
  EXPECT_EQ(again.channel, ra.channel);
  // Empty, too long, or a default-tenant name posing as another tenant's.
  EXPECT_EQ(Open(d, "").status, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(Open(d, std::string(kMaxChannelNameBytes + 1, 'x')).status, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(Open(d, "\x1d" "alpha\x1dprefill-0").status, ErrorCode::INVALID_PARAMS);
  // A ref that is not the connection's client changes nothing.
  Client forged{b.ref, a.conn};
  EXPECT_EQ(Open(forged, "x").status, ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(Close(forged, rb), ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(Close(a, rb), ErrorCode::OBJECT_NOT_FOUND);  // not a's hold
  AnnounceOpenReply wrong = ra;
  wrong.name_hash ^= 2;
  EXPECT_EQ(Close(a, wrong), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(Close(a, ra), ErrorCode::OK);
  EXPECT_EQ(Close(a, again), ErrorCode::OK);
  EXPECT_EQ(Close(a, ra), ErrorCode::OBJECT_NOT_FOUND);  // no hold left
}

TEST_F(MasterAnnounceTest, CapLimitAndReuseAfterClose) {
  config_.announce_channels = 3;
  config_.announce_channels_per_client = 2;
  StartMaster();
  EXPECT_EQ(master_->pool().geometry().announce_channels, 3u);
  Client a = AttachAs("a:1"), b = AttachAs("b:1");
  AnnounceOpenReply a0 = Open(a, "a0"), a1 = Open(a, "a1");
  ASSERT_EQ(a0.status, ErrorCode::OK);
  ASSERT_EQ(a1.status, ErrorCode::OK);
  EXPECT_EQ(Open(a, "a2").status, ErrorCode::NO_AVAILABLE_HANDLE);  // a's cap
  AnnounceOpenReply b0 = Open(b, "b0");
  ASSERT_EQ(b0.status, ErrorCode::OK);
  EXPECT_EQ(Open(b, "b1").status, ErrorCode::NO_AVAILABLE_HANDLE);  // every channel held
  EXPECT_EQ(Open(b, "a0").channel, a0.channel);  // an existing name needs no free channel
  EXPECT_EQ(master_->stats().announce_refusals, 2u);
  // A record on a0 (as a producer's publish leaves head), then a closes it.
  master_->pool().announce_channel(a0.channel)->head.store(1);
  EXPECT_EQ(Close(a, a0), ErrorCode::OK);
  EXPECT_EQ(master_->pool().announce_channel(a0.channel)->head.load(), 1u);  // b still holds it
  // Detach ends every hold of b: a0 and b0 are free.
  EXPECT_EQ(StatusOf(Call(MessageType::kDetach, Enc(b.ref), &b.conn)), ErrorCode::OK);
  EXPECT_EQ(PoolName(a0.channel), a0.name_hash);  // kept while no other name needs it
  AnnounceOpenReply n0 = Open(a, "new-0");
  ASSERT_EQ(n0.status, ErrorCode::OK);
  EXPECT_EQ(Open(a, "new-1").status, ErrorCode::NO_AVAILABLE_HANDLE);  // a's cap again (a1, new-0)
  EXPECT_EQ(Close(a, a1), ErrorCode::OK);
  AnnounceOpenReply n1 = Open(a, "new-1");
  ASSERT_EQ(n1.status, ErrorCode::OK);
  // The two freed channels now carry the new names, wiped.
  for (const auto& r : {n0, n1}) {
    EXPECT_EQ(PoolName(r.channel), r.name_hash);
    EXPECT_EQ(master_->pool().announce_channel(r.channel)->head.load(), 0u);
  }
  EXPECT_GE(master_->stats().announce_channels_freed, 2u);
}

TEST_F(MasterAnnounceTest, RestartedMasterKeepsHeldChannelsAndTheirHolders) {
  config_.announce_channels = 2;
  StartMaster();
  Client a = AttachAs("a:1");
  AnnounceOpenReply x = Open(a, "x"), y = Open(a, "y");
  ASSERT_EQ(x.status, ErrorCode::OK);
  ASSERT_EQ(y.status, ErrorCode::OK);
  EXPECT_EQ(master_->pool().announce_channel(x.channel)->holders[a.ref.slot / 64].load() >> (a.ref.slot % 64) & 1,
            1u);
  config_.format = false;
  StartMaster();  // the same pool; this process (a's pid) still runs
  Client c = AttachAs("c:1");  // takes a's holds: the same pid
  EXPECT_EQ(Open(c, "z").status, ErrorCode::NO_AVAILABLE_HANDLE);  // x and y are still held
  AnnounceOpenReply x2 = Open(c, "x");
  EXPECT_EQ(x2.channel, x.channel);
  EXPECT_EQ(x2.name_hash, x.name_hash);
  EXPECT_EQ(Close(c, x), ErrorCode::OK);   // the hold from before the restart
  EXPECT_EQ(Close(c, x2), ErrorCode::OK);  // and the new one
  EXPECT_EQ(Open(c, "z").status, ErrorCode::OK);  // x is free: z takes it
}

}  // namespace
}  // namespace mcxl
