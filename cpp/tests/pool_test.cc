// Pool: opening (create, missing path, short file, size below the minimum),
// Format + Verify (UUID, magic, layout version, size mismatch), the region
// table's order and alignment, two mappings of one file, and the default
// index capacity; every superblock field corrupted one at a time (Verify and
// Master::Create refuse, naming the field; no overflow passes); the device
// shrinking under a mapping (CheckSize, the SIGBUS handler's remap).
// Pools are files in a temp dir under /dev/shm.
#include "mooncake_cxl/pool/pool.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <bit>
#include <cstddef>
#include <cstring>
#include <set>
#include <filesystem>
#include <string>
#include <vector>

#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/master/master.h"

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

TEST_F(PoolTest, TmpfsHugePolicyNamesTheMountsOption) {
  // /dev/shm is a tmpfs (this fixture's dir): its huge= option, "never" when
  // unset; a pool file elsewhere (not tmpfs here) has none.
  auto on_shm = OpenFormatted(Path("shm"), 8 * kMiB);
  ASSERT_NE(on_shm, nullptr);
  const std::set<std::string> policies = {"never", "always", "within_size", "advise", "deny", "force"};
  EXPECT_EQ(policies.count(on_shm->TmpfsHugePolicy()), 1u) << on_shm->TmpfsHugePolicy();
  char tmpl[] = "/var/tmp/mcxl_pool_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  struct statfs fs {};
  ASSERT_EQ(statfs(tmpl, &fs), 0);
  if (fs.f_type != 0x01021994) {  // not tmpfs on this machine
    auto on_disk = OpenFormatted(std::string(tmpl) + "/disk", 8 * kMiB);
    ASSERT_NE(on_disk, nullptr);
    EXPECT_EQ(on_disk->TmpfsHugePolicy(), "");
  }
  std::filesystem::remove_all(tmpl);
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

// One superblock field set to `value` (a `width`-byte store, as a hostile
// client could make), and the field name the refusal must mention.
struct FieldCase {
  const char* what;
  size_t offset, width;
  uint64_t value;  // absolute, or relative to the pool: see Resolve
  const char* names;
};

uint64_t Read(const char* base, size_t off, size_t width) {
  uint64_t v = 0;
  memcpy(&v, base + off, width);
  return v;
}

std::vector<FieldCase> FieldCases(const Superblock& sb) {
  auto at = [](size_t off) { return off; };
  // offsetof on a struct with atomics: fine on every ABI we build for.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
  std::vector<FieldCase> c = {
      {"pool_size above the mapping", at(offsetof(Superblock, pool_size)), 8, sb.pool_size + 4096, "pool_size"},
      {"pool_size below the minimum", at(offsetof(Superblock, pool_size)), 8, 4096, "pool_size"},
      {"coherence_mode unknown", at(offsetof(Superblock, coherence_mode)), 4, 7, "coherence_mode"},
      {"client_slot_size wrong", at(offsetof(Superblock, client_slot_size)), 4, 64, "client_slot_size"},
      {"client_slot_count 0", at(offsetof(Superblock, client_slot_count)), 4, 0, "client_slot_count"},
      {"client_slot_count 2^32-1", at(offsetof(Superblock, client_slot_count)), 4, 0xffffffffu, "client_slot_count"},
      {"pins_per_client 0", at(offsetof(Superblock, pins_per_client)), 4, 0, "pins_per_client"},
      {"pins_per_client 2^31", at(offsetof(Superblock, pins_per_client)), 4, 1u << 31, "pins_per_client"},
      {"ring_bytes tiny", at(offsetof(Superblock, ring_bytes)), 4, 100, "ring_bytes"},
      {"ring_bytes 2^31", at(offsetof(Superblock, ring_bytes)), 4, 1u << 31, "ring_bytes"},
      {"ring_region_size off by 64", at(offsetof(Superblock, ring_region_size)), 8, sb.ring_region_size + 64,
       "ring_region_size"},
      {"index_capacity 2^58", at(offsetof(Superblock, index_capacity)), 8, 1ull << 58, "index_capacity"},
      {"index_capacity 2^63", at(offsetof(Superblock, index_capacity)), 8, 1ull << 63, "index_capacity"},
      {"index_capacity not a power of two", at(offsetof(Superblock, index_capacity)), 8, sb.index_capacity - 1,
       "index_capacity"},
      {"index_capacity doubled", at(offsetof(Superblock, index_capacity)), 8, sb.index_capacity * 2,
       "index_capacity"},
      {"index_capacity 0", at(offsetof(Superblock, index_capacity)), 8, 0, "index_capacity"},
      {"data_size 2^64 - data_offset", at(offsetof(Superblock, data_size)), 8, 0 - sb.data_offset, "data_size"},
      {"data_size one line too many", at(offsetof(Superblock, data_size)), 8, sb.data_size + 64 * 64, "data_size"},
      {"data_size 0", at(offsetof(Superblock, data_size)), 8, 0, "data_size"},
      {"data_offset unaligned", at(offsetof(Superblock, data_offset)), 8, sb.data_offset + 1, "data_offset"},
      {"data_offset inside the index", at(offsetof(Superblock, data_offset)), 8, sb.index_offset, "data_offset"},
      {"data_offset 2^64-64", at(offsetof(Superblock, data_offset)), 8, 0 - 64ull, "data_offset"},
      {"index_offset 2^64-64", at(offsetof(Superblock, index_offset)), 8, 0 - 64ull, "index_offset"},
      {"index_offset inside the rings", at(offsetof(Superblock, index_offset)), 8, sb.ring_region_offset,
       "index_offset"},
      {"ring_region_offset 0", at(offsetof(Superblock, ring_region_offset)), 8, 0, "ring_region_offset"},
      {"pin_table_offset 2^64-4096", at(offsetof(Superblock, pin_table_offset)), 8, 0 - 4096ull,
       "pin_table_offset"},
      {"client_table_offset inside the superblock", at(offsetof(Superblock, client_table_offset)), 8, 64,
       "client_table_offset"},
      {"layout_version", at(offsetof(Superblock, layout_version)), 4, kLayoutVersion + 1, "layout version"},
      {"announce_channels 0", at(offsetof(Superblock, announce_channels)), 4, 0, "announce_channels"},
      {"announce_channels 2^32-1", at(offsetof(Superblock, announce_channels)), 4, 0xffffffffu, "announce_channels"},
      {"announce_slots 0", at(offsetof(Superblock, announce_slots)), 4, 0, "announce_slots"},
      {"announce_slots not a power of two", at(offsetof(Superblock, announce_slots)), 4, sb.announce_slots - 1,
       "announce_slots"},
      {"announce_slots 2^31", at(offsetof(Superblock, announce_slots)), 4, 1u << 31, "announce_slots"},
      {"announce_slots doubled (past the index)", at(offsetof(Superblock, announce_slots)), 4,
       sb.announce_slots * 2, "index_offset"},
      {"announce_offset unaligned", at(offsetof(Superblock, announce_offset)), 8, sb.announce_offset + 8,
       "announce_offset"},
      {"announce_offset inside the rings", at(offsetof(Superblock, announce_offset)), 8, sb.ring_region_offset,
       "announce_offset"},
      {"announce_offset 2^64-64", at(offsetof(Superblock, announce_offset)), 8, 0 - 64ull, "announce_offset"},
  };
#pragma GCC diagnostic pop
  return c;
}

TEST_F(PoolTest, EveryCorruptSuperblockFieldIsRefusedByName) {
  auto pool = OpenFormatted(Path("a"), 8 * kMiB);
  ASSERT_TRUE(pool);
  char* base = pool->base();
  for (const FieldCase& c : FieldCases(*pool->superblock())) {
    uint64_t saved = Read(base, c.offset, c.width);
    memcpy(base + c.offset, &c.value, c.width);
    // A fresh mapping, as a client attaching (or a master starting) has.
    auto other = Pool::Open(Path("a"), 0, false);
    ASSERT_TRUE(other.ok()) << c.what;
    testing::internal::CaptureStderr();
    Status s = (*other)->Verify(nullptr);
    std::string log = testing::internal::GetCapturedStderr();
    EXPECT_EQ(s.error(), ErrorCode::INVALID_PARAMS) << c.what;
    EXPECT_NE(log.find(c.names), std::string::npos) << c.what << ": " << log;
    // The mapping that verified first does not adopt a changed table either.
    EXPECT_EQ(pool->Verify(nullptr).error(), ErrorCode::INVALID_PARAMS) << c.what;
    memcpy(base + c.offset, &saved, c.width);
    EXPECT_TRUE(pool->Verify(nullptr).ok()) << c.what;
  }
}

TEST_F(PoolTest, MasterRefusesToStartOnACorruptSuperblockNamingTheField) {
  SetLogLevel(LogLevel::kError);
  MasterConfig cfg;
  cfg.cxl_path = Path("m");
  cfg.cxl_size = 16 * kMiB;
  cfg.format = true;
  {
    auto m = Master::Create(cfg);
    ASSERT_TRUE(m.ok());
  }
  cfg.format = false;
  auto pool = Pool::Open(Path("m"), 0, false);
  ASSERT_TRUE(pool.ok());
  ASSERT_TRUE((*pool)->Verify(nullptr).ok());
  char* base = (*pool)->base();
  for (const FieldCase& c : FieldCases(*(*pool)->superblock())) {
    uint64_t saved = Read(base, c.offset, c.width);
    memcpy(base + c.offset, &c.value, c.width);
    testing::internal::CaptureStderr();
    auto m = Master::Create(cfg);  // must not abort in vector::reserve for index_capacity 2^58
    std::string log = testing::internal::GetCapturedStderr();
    EXPECT_EQ(m.error(), ErrorCode::INVALID_PARAMS) << c.what;
    EXPECT_NE(log.find(c.names), std::string::npos) << c.what << ": " << log;
    memcpy(base + c.offset, &saved, c.width);
  }
  EXPECT_TRUE(Master::Create(cfg).ok());  // restored: it starts (and recovers) again
}

TEST_F(PoolTest, FormatRefusesOptionsThatWouldOverflow) {
  auto r = Pool::Open(Path("a"), 8 * kMiB, true);
  ASSERT_TRUE(r.ok());
  FormatOptions fo;
  fo.index_capacity = (1ull << 63) + 1;  // NextPow2 would never end
  EXPECT_EQ((*r)->Format(fo).error(), ErrorCode::INVALID_PARAMS);
  fo = FormatOptions{};
  fo.client_slots = 0;
  EXPECT_EQ((*r)->Format(fo).error(), ErrorCode::INVALID_PARAMS);
  fo = FormatOptions{};
  fo.ring_bytes_per_client = 1ull << 40;
  EXPECT_EQ((*r)->Format(fo).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_TRUE((*r)->Format(FormatOptions{}).ok());
}

TEST_F(PoolTest, GeometryIsAPrivateCopy) {
  auto pool = OpenFormatted(Path("a"), 8 * kMiB);
  ASSERT_TRUE(pool);
  Superblock* sb = pool->superblock();
  IndexEntry* index = pool->index();
  uint64_t data_offset = sb->data_offset, data_size = sb->data_size;
  // A client rewrites the region table after we verified it.
  sb->index_offset = 1ull << 62;
  sb->data_size = ~uint64_t(0) - sb->data_offset;
  sb->pins_per_client = 1u << 30;
  EXPECT_EQ(pool->index(), index);
  EXPECT_FALSE(pool->InDataRegion(data_offset + data_size, 64));
  EXPECT_TRUE(pool->InDataRegion(data_offset, data_size));
  EXPECT_EQ(pool->geometry().pins_per_client, FormatOptions{}.pins_per_client);
}

TEST_F(PoolTest, ShrunkDeviceFailsThePool) {
  auto pool = OpenFormatted(Path("a"), 8 * kMiB);
  ASSERT_TRUE(pool);
  EXPECT_TRUE(pool->CheckSize());
  EXPECT_FALSE(pool->failed());
  ASSERT_EQ(truncate(Path("a").c_str(), 4 * kMiB), 0);
  testing::internal::CaptureStderr();
  EXPECT_FALSE(pool->CheckSize());
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(pool->failed());
  EXPECT_NE(log.find("pool device shrank from 8388608 to 4194304 bytes"), std::string::npos) << log;
  // Growing it back does not make the pool trustworthy again.
  ASSERT_EQ(truncate(Path("a").c_str(), 8 * kMiB), 0);
  EXPECT_FALSE(pool->CheckSize());
  // A client refuses to map a file smaller than the pool it was told of.
  ASSERT_EQ(truncate(Path("a").c_str(), 6 * kMiB), 0);
  EXPECT_EQ(Pool::Open(Path("a"), 8 * kMiB, false).error(), ErrorCode::INVALID_PARAMS);
}

// In a child process (the handler is process-wide): a SIGBUS past the end of
// a shrunk file is survived with kRemap, and kills with kPoolLostExitCode and
// a log line naming the offset with kExit.
int ChildTouchesShrunkPool(const std::string& path, PoolFaultAction action) {
  pid_t pid = fork();
  if (pid == 0) {
    InstallPoolFaultHandler(action);
    auto pool = Pool::Open(path, 0, false);
    if (!pool.ok() || !(*pool)->Verify(nullptr).ok()) _exit(10);
    if (truncate(path.c_str(), 4 * kMiB) != 0) _exit(11);
    volatile char* p = (*pool)->base() + 6 * kMiB + 100;
    char v = *p;  // beyond EOF: SIGBUS
    *p = 1;
    if (v != 0 || !(*pool)->failed()) _exit(12);
    volatile char* low = (*pool)->base() + 4096;  // below the fault: still the file
    (void)*low;
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(PoolTest, SigbusInTheMappingIsHandled) {
  { ASSERT_TRUE(OpenFormatted(Path("a"), 8 * kMiB)); }
  EXPECT_EQ(ChildTouchesShrunkPool(Path("a"), PoolFaultAction::kRemap), 0);
  ASSERT_EQ(truncate(Path("a").c_str(), 0), 0);
  { ASSERT_TRUE(OpenFormatted(Path("a"), 8 * kMiB)); }
  std::string log_path = Path("child.log");
  testing::internal::CaptureStderr();
  int code = ChildTouchesShrunkPool(Path("a"), PoolFaultAction::kExit);
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, kPoolLostExitCode);
  EXPECT_NE(log.find("SIGBUS at offset 6291556 of pool"), std::string::npos) << log;
  EXPECT_NE(log.find("pool device shrank from 8388608 to 4194304 bytes; the master exits"), std::string::npos)
      << log;
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
