// Pool: opening (create, missing path, short file, size below the minimum),
// Format + Verify (UUID, magic, layout version, size mismatch), the region
// table's order and alignment, two mappings of one file, and the default
// index capacity. Pools are files in a temp dir under /dev/shm.
#include "mooncake_cxl/pool.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <string>

namespace mcxl {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/mcxl_pool_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const char* name) const { return dir_ + "/" + name; }
  // A regular file of `size` bytes (zeros).
  void MakeFile(const std::string& path, uint64_t size) {
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, off_t(size)), 0);
    close(fd);
  }
  std::unique_ptr<Pool> OpenFormatted(const std::string& path, uint64_t size) {
    auto p = Pool::Open(path, size, true);
    EXPECT_TRUE(p.ok());
    if (!p.ok()) return nullptr;
    EXPECT_TRUE((*p)->Format(FormatOptions{}).ok());
    return std::move(p.value());
  }

  std::string dir_;
};

TEST_F(PoolTest, CreateFormatVerify) {
  auto r = Pool::Open(Path("a"), 8 * kMiB, true);
  ASSERT_TRUE(r.ok());
  Pool& pool = **r;
  EXPECT_EQ(pool.size(), 8 * kMiB);
  EXPECT_EQ(std::filesystem::file_size(Path("a")), 8 * kMiB);
  EXPECT_FALSE(pool.IsFormatted());
  EXPECT_EQ(pool.Verify(nullptr).error(), ErrorCode::INVALID_PARAMS);
  ASSERT_TRUE(pool.Format(FormatOptions{}).ok());
  EXPECT_TRUE(pool.IsFormatted());
  EXPECT_TRUE(pool.Verify(nullptr).ok());
  EXPECT_TRUE(pool.Verify(pool.superblock()->uuid).ok());
  EXPECT_EQ(pool.superblock()->magic, kPoolMagic);
  EXPECT_EQ(pool.superblock()->layout_version, kLayoutVersion);
  EXPECT_EQ(pool.superblock()->pool_size, 8 * kMiB);
  EXPECT_EQ(pool.UuidString().size(), 36u);
  EXPECT_EQ(pool.UuidString()[14], '4');  // RFC 4122 version 4
}

TEST_F(PoolTest, VerifyWithWrongUuidFails) {
  auto pool = OpenFormatted(Path("a"), 8 * kMiB);
  ASSERT_TRUE(pool);
  uint8_t uuid[16];
  memcpy(uuid, pool->superblock()->uuid, 16);
  uuid[15] ^= 1;
  EXPECT_EQ(pool->Verify(uuid).error(), ErrorCode::INVALID_PARAMS);
  uint8_t zeros[16] = {};
  EXPECT_EQ(pool->Verify(zeros).error(), ErrorCode::INVALID_PARAMS);
  // A re-format gets a new UUID.
  uint8_t old_uuid[16];
  memcpy(old_uuid, pool->superblock()->uuid, 16);
  ASSERT_TRUE(pool->Format(FormatOptions{}).ok());
  EXPECT_EQ(pool->Verify(old_uuid).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_TRUE(pool->Verify(nullptr).ok());
}

TEST_F(PoolTest, CorruptMagicAndVersionFailThenRestore) {
  auto pool = OpenFormatted(Path("a"), 8 * kMiB);
  ASSERT_TRUE(pool);
  Superblock* sb = pool->superblock();
  const uint8_t* uuid = sb->uuid;

  sb->magic ^= 0xff;
  EXPECT_FALSE(pool->IsFormatted());
  EXPECT_EQ(pool->Verify(nullptr).error(), ErrorCode::INVALID_PARAMS);
  sb->magic ^= 0xff;
  EXPECT_TRUE(pool->Verify(uuid).ok());

  sb->layout_version = kLayoutVersion + 1;
  EXPECT_TRUE(pool->IsFormatted());
  EXPECT_EQ(pool->Verify(nullptr).error(), ErrorCode::INVALID_PARAMS);
  sb->layout_version = kLayoutVersion;
  EXPECT_TRUE(pool->Verify(uuid).ok());

  uint64_t data_offset = sb->data_offset;
  sb->data_offset = sb->index_offset;  // index would overlap the data region
  EXPECT_EQ(pool->Verify(nullptr).error(), ErrorCode::INVALID_PARAMS);
  sb->data_offset = data_offset;
  uint64_t cap = sb->index_capacity;
  sb->index_capacity = cap - 1;  // not a power of two
  EXPECT_EQ(pool->Verify(nullptr).error(), ErrorCode::INVALID_PARAMS);
  sb->index_capacity = cap;
  EXPECT_TRUE(pool->Verify(uuid).ok());
}

TEST_F(PoolTest, MissingPathWithoutCreateFails) {
  auto r = Pool::Open(Path("missing"), 8 * kMiB, false);
  EXPECT_EQ(r.error(), ErrorCode::INVALID_PARAMS);
  EXPECT_FALSE(std::filesystem::exists(Path("missing")));
  EXPECT_EQ(Pool::Open("", 8 * kMiB, true).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(Pool::Open(dir_, 8 * kMiB, false).error(), ErrorCode::INVALID_PARAMS);  // a directory
}

TEST_F(PoolTest, FileSmallerThanRequestedFails) {
  MakeFile(Path("small"), 4 * kMiB);
  EXPECT_EQ(Pool::Open(Path("small"), 8 * kMiB, false).error(), ErrorCode::INVALID_PARAMS);
  // create does not grow an existing file either.
  EXPECT_EQ(Pool::Open(Path("small"), 8 * kMiB, true).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(std::filesystem::file_size(Path("small")), 4 * kMiB);
  // Its own size (size 0) is fine.
  auto r = Pool::Open(Path("small"), 0, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->size(), 4 * kMiB);
}

TEST_F(PoolTest, SizeBelowMinimumFails) {
  EXPECT_EQ(Pool::Open(Path("tiny"), kMinPoolSize - 4096, true).error(), ErrorCode::INVALID_PARAMS);
  MakeFile(Path("tiny2"), 1 * kMiB);
  EXPECT_EQ(Pool::Open(Path("tiny2"), 0, false).error(), ErrorCode::INVALID_PARAMS);
  MakeFile(Path("big"), 8 * kMiB);
  EXPECT_EQ(Pool::Open(Path("big"), 1 * kMiB, false).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_TRUE(Pool::Open(Path("big"), kMinPoolSize, false).ok());
}

TEST_F(PoolTest, MappedSmallerThanFormattedFailsVerify) {
  {
    auto pool = OpenFormatted(Path("a"), 16 * kMiB);
    ASSERT_TRUE(pool);
  }
  auto part = Pool::Open(Path("a"), 8 * kMiB, false);  // the file holds 16 MiB
  ASSERT_TRUE(part.ok());
  EXPECT_TRUE((*part)->IsFormatted());
  EXPECT_EQ((*part)->Verify(nullptr).error(), ErrorCode::INVALID_PARAMS);
  auto whole = Pool::Open(Path("a"), 0, false);
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE((*whole)->Verify(nullptr).ok());
}

TEST_F(PoolTest, RegionTableOrderedAndAligned) {
  for (uint64_t size : {kMinPoolSize, 8 * kMiB, 64 * kMiB, 96 * kMiB + 4096}) {
    auto r = Pool::Open(Path("a"), size, true);
    ASSERT_TRUE(r.ok()) << size;
    Pool& pool = **r;
    FormatOptions fo;
    fo.client_slots = 7;
    ASSERT_TRUE(pool.Format(fo).ok()) << size;
    const Superblock* sb = pool.superblock();
    for (uint64_t off : {sb->client_table_offset, sb->ring_region_offset, sb->index_offset,
                         sb->data_offset, sb->data_size})
      EXPECT_EQ(off % 64, 0u) << size;
    EXPECT_GE(sb->client_table_offset, kSuperblockSize);
    EXPECT_EQ(sb->client_slot_count, 7u);
    EXPECT_EQ(sb->client_slot_size, sizeof(ClientSlot));
    EXPECT_LE(sb->client_table_offset + sb->client_slot_count * sizeof(ClientSlot), sb->ring_region_offset);
    EXPECT_LE(sb->ring_region_offset + sb->ring_region_size, sb->index_offset);
    EXPECT_LE(sb->index_offset + sb->index_capacity * sizeof(IndexEntry), sb->data_offset);
    EXPECT_LE(sb->data_offset + sb->data_size, sb->pool_size);
    EXPECT_GT(sb->data_size, 0u);
    EXPECT_EQ(sb->index_capacity, DefaultIndexCapacity(size));
    EXPECT_TRUE(pool.InDataRegion(sb->data_offset, sb->data_size));
    EXPECT_FALSE(pool.InDataRegion(sb->data_offset - 64, 64));
    EXPECT_FALSE(pool.InDataRegion(sb->data_offset, sb->data_size + 1));
    EXPECT_FALSE(pool.InDataRegion(sb->data_offset + 64, ~uint64_t(0)));
    EXPECT_FALSE(pool.InDataRegion(~uint64_t(0) - 10, 64));
    // Format zeroes the index.
    EXPECT_EQ(pool.index()[0].state_gen.load(), 0u);
    std::filesystem::remove(Path("a"));  // the next size starts from a new file
  }
}

TEST_F(PoolTest, IndexCapacityOptionRoundsUpAndMustFit) {
  auto r = Pool::Open(Path("a"), 8 * kMiB, true);
  ASSERT_TRUE(r.ok());
  FormatOptions fo;
  fo.index_capacity = 1000;
  ASSERT_TRUE((*r)->Format(fo).ok());
  EXPECT_EQ((*r)->superblock()->index_capacity, 1024u);
  fo.index_capacity = 1u << 20;  // 64 MiB of index in an 8 MiB pool
  EXPECT_EQ((*r)->Format(fo).error(), ErrorCode::INVALID_PARAMS);
}

TEST_F(PoolTest, TwoMappingsShareOneFile) {
  auto a = OpenFormatted(Path("a"), 8 * kMiB);
  ASSERT_TRUE(a);
  auto b = Pool::Open(Path("a"), 0, false);
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*b)->base(), a->base());
  EXPECT_TRUE((*b)->Verify(a->superblock()->uuid).ok());
  a->index()[5].key_hash.store(1234);
  EXPECT_EQ((*b)->index()[5].key_hash.load(), 1234u);
}

TEST(DefaultIndexCapacityTest, PowerOfTwoAtLeast1024) {
  for (uint64_t size : {uint64_t(0), uint64_t(4096), kMinPoolSize, 8 * kMiB, 64 * kMiB + 12345,
                        1024 * kMiB, 3 * 1024 * kMiB, uint64_t(1) << 40}) {
    uint64_t cap = DefaultIndexCapacity(size);
    EXPECT_GE(cap, 1024u) << size;
    EXPECT_TRUE(std::has_single_bit(cap)) << size;
  }
  EXPECT_LE(DefaultIndexCapacity(64 * kMiB), DefaultIndexCapacity(1024 * kMiB));
}

// pool.h promises one entry per 4 KiB of pool.
TEST(DefaultIndexCapacityTest, OneEntryPer4KiBAsDocumented) {
  EXPECT_EQ(DefaultIndexCapacity(64 * kMiB), 16384u);
  EXPECT_EQ(DefaultIndexCapacity(1024 * kMiB), 262144u);
}

}  // namespace
}  // namespace mcxl
