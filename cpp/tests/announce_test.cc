// Announcement channels (announce.h) in one process: publish and read in
// order, a reader that starts first, lapping (told, resumes at the oldest
// record held), one producer per channel, release and re-claim, Wait timing
// out, a channel freed and renamed (its old reader and producer lose it, the
// new name sees none of the old records), and pool bytes a faulty client
// scribbled (a head far ahead, a torn seq) giving kLapped, never a garbage
// record. The master's naming is tested through real clients (tests/kv).
#include "mooncake_cxl/control/announce.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace mcxl {
namespace {

class AnnounceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/mcxl_announce_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto p = Pool::Open(dir_ + "/pool", 16ull << 20, true);
    ASSERT_TRUE(p.ok());
    FormatOptions o;
    o.announce_channels = 4;
    o.announce_slots = 8;
    ASSERT_TRUE((*p)->Format(o).ok());
    pool_ = std::shared_ptr<Pool>(std::move(p.value()));
  }
  void TearDown() override {
    pool_.reset();
    std::filesystem::remove_all(dir_);
  }
  static AnnounceMessage Msg(uint64_t v) {
    AnnounceMessage m;
    for (int i = 0; i < 7; ++i) m.words[i] = v * 10 + i;
    return m;
  }
  // What the master does at kAnnounceOpen of a free channel.
  uint64_t Name(uint32_t ch, const char* name) {
    uint64_t h = AnnounceNameHash(name);
    NameAnnounceChannel(*pool_, ch, h);
    return h;
  }
  std::string dir_;
  std::shared_ptr<Pool> pool_;
};

TEST_F(AnnounceTest, PublishReadLapAndClaim) {
  const uint64_t p0 = Name(1, "p0");
  auto early = AnnounceReader::Open(pool_, 1, p0, true);  // before any producer
  ASSERT_TRUE(early.ok());
  int closes = 0;
  auto prod = AnnounceProducer::Open(pool_, 1, p0, [&] { ++closes; });
  ASSERT_TRUE(prod.ok());
  EXPECT_EQ(AnnounceProducer::Open(pool_, 1, p0, [&] { ++closes; }).error(), ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(closes, 1);  // a refused open releases its hold at once
  EXPECT_EQ(AnnounceReader::Open(pool_, 1, p0 ^ 2, true).error(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(AnnounceReader::Open(pool_, 4, p0, true).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ((*early)->producer_pid(), uint64_t(getpid()));
  AnnounceMessage m;
  uint64_t n = 0;
  EXPECT_EQ((*early)->Next(&m, &n), AnnounceReader::ReadResult::kEmpty);
  EXPECT_FALSE((*early)->Wait(1000, 1000000));  // 1 ms: nothing comes
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(*(*prod)->Publish(Msg(i)), i);
  EXPECT_TRUE((*early)->Wait(1000, 1000000));
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_EQ((*early)->Next(&m, &n), AnnounceReader::ReadResult::kOk);
    EXPECT_EQ(n, i);
    for (int w = 0; w < 7; ++w) EXPECT_EQ(m.words[w], i * 10 + w);
  }
  // 20 more: the reader is lapped by 20 - 8 and resumes at the oldest held.
  for (uint64_t i = 3; i < 23; ++i) ASSERT_TRUE((*prod)->Publish(Msg(i)).ok());
  ASSERT_EQ((*early)->Next(&m, &n), AnnounceReader::ReadResult::kLapped);
  EXPECT_EQ(n, 12u);
  for (uint64_t i = 15; i < 23; ++i) {
    ASSERT_EQ((*early)->Next(&m, &n), AnnounceReader::ReadResult::kOk);
    EXPECT_EQ(n, i);
    EXPECT_EQ(m.words[0], i * 10);
  }
  auto late = AnnounceReader::Open(pool_, 1, p0, false);
  ASSERT_TRUE(late.ok());
  EXPECT_EQ((*late)->cursor(), 23u);
  (*prod)->Close();
  EXPECT_EQ(closes, 2);
  EXPECT_EQ((*early)->producer_pid(), 0u);
  EXPECT_EQ((*prod)->Publish(Msg(50)).error(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);  // closed
  auto again = AnnounceProducer::Open(pool_, 1, p0);  // released: claimable, numbers continue
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*(*again)->Publish(Msg(99)), 23u);
}

TEST_F(AnnounceTest, FreedChannelIsLostToItsOldUsersAndWipedForTheNext) {
  const uint64_t a = Name(2, "tenant-a/ch");
  auto prod = AnnounceProducer::Open(pool_, 2, a);
  auto rd = AnnounceReader::Open(pool_, 2, a, true);
  ASSERT_TRUE(prod.ok() && rd.ok());
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE((*prod)->Publish(Msg(i)).ok());
  AnnounceMessage m;
  uint64_t n = 0;
  ASSERT_EQ((*rd)->Next(&m, &n), AnnounceReader::ReadResult::kOk);
  FreeAnnounceChannel(*pool_, 2);
  EXPECT_EQ((*rd)->Next(&m, &n), AnnounceReader::ReadResult::kLost);
  EXPECT_FALSE((*rd)->named());
  EXPECT_TRUE((*rd)->Wait(0, 1000000000));  // returns at once: lost
  const uint64_t b = Name(2, "tenant-b/ch");
  // The old producer cannot write under the new name; the old reader reads nothing of it.
  EXPECT_EQ((*prod)->Publish(Msg(7)).error(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  auto fresh = AnnounceReader::Open(pool_, 2, b, true);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->head(), 0u);
  EXPECT_EQ((*fresh)->Next(&m, &n), AnnounceReader::ReadResult::kEmpty);  // the old records are gone
  auto prod_b = AnnounceProducer::Open(pool_, 2, b);
  ASSERT_TRUE(prod_b.ok());
  ASSERT_EQ(*(*prod_b)->Publish(Msg(40)), 0u);
  EXPECT_EQ((*rd)->Next(&m, &n), AnnounceReader::ReadResult::kLost);
  ASSERT_EQ((*fresh)->Next(&m, &n), AnnounceReader::ReadResult::kOk);
  EXPECT_EQ(m.words[0], 400u);
  uint64_t machine = 0;
  EXPECT_EQ(AnnounceOwner(*pool_, 2, &machine), uint64_t(getpid()));
  SetAnnounceHolder(*pool_, 2, 70, true);
  EXPECT_EQ(pool_->announce_channel(2)->holders[1].load(), 1ull << 6);
  SetAnnounceHolder(*pool_, 2, 70, false);
  EXPECT_EQ(pool_->announce_channel(2)->holders[1].load(), 0u);
}

TEST_F(AnnounceTest, ScribbledChannelNeverYieldsGarbage) {
  const uint64_t h = Name(0, "s");
  auto prod = AnnounceProducer::Open(pool_, 0, h);
  auto rd = AnnounceReader::Open(pool_, 0, h, true);
  ASSERT_TRUE(prod.ok() && rd.ok());
  ASSERT_TRUE((*prod)->Publish(Msg(0)).ok());
  ASSERT_TRUE((*prod)->Publish(Msg(1)).ok());
  // A faulty client rewrites record 0's seq: the reader skips it as lost.
  AnnounceChannelHeader* ch = nullptr;
  for (uint32_t i = 0; i < pool_->geometry().announce_channels; ++i)
    if (pool_->announce_channel(i)->head.load() == 2) ch = pool_->announce_channel(i);
  ASSERT_NE(ch, nullptr);
  auto* rec = reinterpret_cast<AnnounceRecord*>(ch + 1);
  rec[0].seq.store(12345);
  AnnounceMessage m;
  uint64_t n = 0;
  EXPECT_EQ((*rd)->Next(&m, &n), AnnounceReader::ReadResult::kLapped);
  ASSERT_EQ((*rd)->Next(&m, &n), AnnounceReader::ReadResult::kOk);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(m.words[0], 10u);
  // A head far ahead: lapped, then records whose seq does not match are skipped.
  ch->head.store(1000000);
  EXPECT_EQ((*rd)->Next(&m, &n), AnnounceReader::ReadResult::kLapped);
  for (int i = 0; i < 8; ++i) EXPECT_NE((*rd)->Next(&m, &n), AnnounceReader::ReadResult::kOk);
  // A head rewritten backwards: the reader's cursor is pulled back, not stuck.
  ch->head.store(2);
  EXPECT_EQ((*rd)->Next(&m, &n), AnnounceReader::ReadResult::kEmpty);
  EXPECT_EQ((*rd)->cursor(), 2u);
}

}  // namespace
}  // namespace mcxl
