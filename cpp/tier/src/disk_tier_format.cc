// SSD tier: crc32c, header encode/verify, aligned buffers, I/O helpers.
#include <errno.h>
#include <fcntl.h>
#include <nmmintrin.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <cstdio>

#include "disk_tier_internal.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl::tier {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // Castagnoli, reflected

std::array<std::array<uint32_t, 256>, 8> MakeTables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int s = 1; s < 8; s++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  return t;
}
const auto kTables = MakeTables();

uint32_t Crc32cSoft(const uint8_t* p, size_t n, uint32_t c) {
  while (n >= 8) {  // slicing-by-8
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= c;
    c = kTables[7][w & 0xff] ^ kTables[6][(w >> 8) & 0xff] ^ kTables[5][(w >> 16) & 0xff] ^
        kTables[4][(w >> 24) & 0xff] ^ kTables[3][(w >> 32) & 0xff] ^
        kTables[2][(w >> 40) & 0xff] ^ kTables[1][(w >> 48) & 0xff] ^ kTables[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xff];
  return c;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHw(const uint8_t* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = uint32_t(c64);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");

}  // namespace

uint32_t Crc32c(const void* data, size_t len, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  c = kHaveSse42 ? Crc32cHw(p, len, c) : Crc32cSoft(p, len, c);
  return ~c;
}

void SealRecordHeader(RecordHeader* h) { h->header_crc = Crc32c(h, offsetof(RecordHeader, header_crc)); }
void SealSegmentHeader(SegmentHeader* h) {
  h->header_crc = Crc32c(h, offsetof(SegmentHeader, header_crc));
}

const char* CheckRecordHeader(const RecordHeader& h, uint32_t segment_id, uint64_t offset,
                              uint64_t file_size) {
  if (h.magic != kRecordMagic) return "magic";
  if (h.header_crc != Crc32c(&h, offsetof(RecordHeader, header_crc))) return "header crc";
  if (h.version != kFormatVersion) return "version";
  if (h.kind != kKindValue && h.kind != kKindTombstone) return "kind";
  if (h.segment_id != segment_id || h.offset != offset) return "location";
  if (h.key_len == 0 || h.key_len > kMaxTierKeyLength) return "key_len";
  if (h.value_len > kMaxTierValueLength) return "value_len";
  if (h.kind == kKindTombstone && h.value_len != 0) return "tombstone value_len";
  // The data must be in the file; the padding may be cut off by a crash.
  if (offset > file_size || kHeaderBytes + h.key_len + h.value_len > file_size - offset)
    return "extends past end of file";
  return nullptr;
}

const char* CheckSegmentHeader(const SegmentHeader& h, uint32_t segment_id) {
  if (h.magic != kSegmentMagic) return "magic";
  if (h.header_crc != Crc32c(&h, offsetof(SegmentHeader, header_crc))) return "header crc";
  if (h.version != kFormatVersion) return "version";
  if (h.block_size != kBlockSize) return "block_size";
  if (h.segment_id != segment_id) return "segment_id";
  return nullptr;
}

AlignedBuf AllocAligned(uint64_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kBlockSize, AlignUp(bytes ? bytes : 1)) != 0) return nullptr;
  return AlignedBuf(static_cast<uint8_t*>(p));
}

uint8_t* ThreadBuffer(int which, uint64_t bytes) {
  if (which < 0 || which >= kThreadBuffers) return nullptr;
  thread_local AlignedBuf bufs[kThreadBuffers];
  thread_local uint64_t sizes[kThreadBuffers] = {};
  if (sizes[which] < bytes) {
    bufs[which] = AllocAligned(bytes);
    sizes[which] = bufs[which] ? AlignUp(bytes) : 0;
  }
  return bufs[which].get();
}

int PreadUpTo(int fd, void* buf, uint64_t len, uint64_t off, uint64_t* got) {
  auto* p = static_cast<uint8_t*>(buf);
  *got = 0;
  while (*got < len) {
    ssize_t n = pread(fd, p + *got, len - *got, off_t(off + *got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) break;
    *got += uint64_t(n);
  }
  return 0;
}

int PreadFull(int fd, void* buf, uint64_t len, uint64_t off) {
  uint64_t got = 0;
  int e = PreadUpTo(fd, buf, len, off, &got);
  if (e != 0) return e;
  return got < len ? ENODATA : 0;
}

int PwriteFull(int fd, const void* buf, uint64_t len, uint64_t off) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = pwrite(fd, p, len, off_t(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    p += n;
    len -= uint64_t(n);
    off += uint64_t(n);
  }
  return 0;
}

int OpenMaybeDirect(const std::string& path, int flags, bool direct, bool* direct_out, uint32_t mode) {
  *direct_out = false;
  if (direct) {
    // MCXL_TIER_NO_ODIRECT=1 makes O_DIRECT look unsupported (tests of the
    // fallback: tmpfs supports O_DIRECT since Linux 6.6).
    const bool fake_einval = getenv("MCXL_TIER_NO_ODIRECT") != nullptr &&
                                    strcmp(getenv("MCXL_TIER_NO_ODIRECT"), "1") == 0;
    int fd = fake_einval ? -1 : open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, mode_t(mode));
    if (fake_einval) errno = EINVAL;
    if (fd >= 0) {
      *direct_out = true;
      return fd;
    }
    if (errno != EINVAL) return -1;
    static bool logged = false;  // once per process: tmpfs and friends
    if (!logged) {
      logged = true;
      MCXL_LOG(kInfo, "disk_tier", "O_DIRECT not supported for %s; using buffered I/O",
               path.c_str());
    }
  }
  return open(path.c_str(), flags | O_CLOEXEC, mode_t(mode));
}

int SetFileMode(int fd, uint32_t mode, int64_t group) {
  if (group >= 0 && fchown(fd, uid_t(-1), gid_t(group)) != 0) return errno;
  return fchmod(fd, mode_t(mode)) == 0 ? 0 : errno;
}

bool LogLimit::Allow(uint64_t* suppressed_out) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const uint64_t now = uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  if (last_ns != 0 && now - last_ns < 1000000000ull) {
    suppressed++;
    return false;
  }
  last_ns = now;
  *suppressed_out = suppressed;
  suppressed = 0;
  return true;
}

int FsyncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int rc = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

bool ParseSegmentName(std::string_view name, uint32_t* id) {
  if (name.size() != 17 || name.substr(0, 4) != "seg-" || name.substr(12) != ".mcxl") return false;
  uint32_t v = 0;
  for (char c : name.substr(4, 8)) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = v * 16 + uint32_t(d);
  }
  if (v == 0) return false;
  *id = v;
  return true;
}

std::string SegmentPath(const std::string& root_dir, uint32_t segment_id) {
  char name[32];
  snprintf(name, sizeof(name), "/seg-%08x.mcxl", segment_id);
  return root_dir + name;
}

}  // namespace mcxl::tier
