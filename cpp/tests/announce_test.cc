// Announcement channels (announce.h) in one process: publish and read in
// order, a reader that starts first, lapping (told, resumes at the oldest
// record held), one producer per channel, release and re-claim, many names,
// Wait timing out, and pool bytes a faulty client scribbled (a head far
// ahead, a torn seq) giving kLapped, never a garbage record.
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
  std::string dir_;
  std::shared_ptr<Pool> pool_;
};

TEST_F(AnnounceTest, PublishReadLapAndClaim) {
  auto early = AnnounceReader::Open(pool_, "p0", true);  // before any producer
  ASSERT_TRUE(early.ok());
  auto prod = AnnounceProducer::Open(pool_, "p0");
  ASSERT_TRUE(prod.ok());
  EXPECT_EQ(AnnounceProducer::Open(pool_, "p0").error(), ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ((*early)->producer_pid(), uint64_t(getpid()));
  AnnounceMessage m;
  uint64_t n = 0;
  EXPECT_EQ((*early)->Next(&m, &n), AnnounceReader::ReadResult::kEmpty);
  EXPECT_FALSE((*early)->Wait(1000, 1000000));  // 1 ms: nothing comes
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ((*prod)->Publish(Msg(i)), i);
  EXPECT_TRUE((*early)->Wait(1000, 1000000));
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_EQ((*early)->Next(&m, &n), AnnounceReader::ReadResult::kOk);
    EXPECT_EQ(n, i);
    for (int w = 0; w < 7; ++w) EXPECT_EQ(m.words[w], i * 10 + w);
  }
  // 20 more: the reader is lapped by 20 - 8 and resumes at the oldest held.
  for (uint64_t i = 3; i < 23; ++i) (*prod)->Publish(Msg(i));
  ASSERT_EQ((*early)->Next(&m, &n), AnnounceReader::ReadResult::kLapped);
  EXPECT_EQ(n, 12u);
  for (uint64_t i = 15; i < 23; ++i) {
    ASSERT_EQ((*early)->Next(&m, &n), AnnounceReader::ReadResult::kOk);
    EXPECT_EQ(n, i);
    EXPECT_EQ(m.words[0], i * 10);
  }
  auto late = AnnounceReader::Open(pool_, "p0", false);
  ASSERT_TRUE(late.ok());
  EXPECT_EQ((*late)->cursor(), 23u);
  (*prod)->Close();
  EXPECT_EQ((*early)->producer_pid(), 0u);
  auto again = AnnounceProducer::Open(pool_, "p0");  // released: claimable, numbers continue
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->Publish(Msg(99)), 23u);
  // 4 channels: three more names fit, a fifth does not.
  for (const char* name : {"p1", "p2", "p3"}) EXPECT_TRUE(AnnounceReader::Open(pool_, name, true).ok()) << name;
  EXPECT_EQ(AnnounceReader::Open(pool_, "p4", true).error(), ErrorCode::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(AnnounceReader::Open(pool_, "", true).error(), ErrorCode::INVALID_PARAMS);
}

TEST_F(AnnounceTest, ScribbledChannelNeverYieldsGarbage) {
  auto prod = AnnounceProducer::Open(pool_, "s");
  auto rd = AnnounceReader::Open(pool_, "s", true);
  ASSERT_TRUE(prod.ok() && rd.ok());
  (*prod)->Publish(Msg(0));
  (*prod)->Publish(Msg(1));
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
