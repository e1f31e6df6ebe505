// Internals of the SSD tier (disk_tier.h): on-disk structs, encode/verify,
// aligned buffers, record images and I/O helpers shared by disk_tier*.cc,
// and the tier's state (DiskTier::Impl).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "mooncake_cxl/tier/disk_tier.h"

namespace mcxl::tier {

constexpr uint64_t kSegmentMagic = 0x314745534c58434dull;  // bytes "MCXLSEG1"
constexpr uint32_t kRecordMagic = 0x5258434d;             // "MCXR"
constexpr uint16_t kFormatVersion = 1;
constexpr uint16_t kKindValue = 1;
constexpr uint16_t kKindTombstone = 2;
constexpr uint32_t kRecordCopy = 1;  // RecordHeader::reserved: a compaction copy (its seq is the original's)

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t segment_id;
  uint32_t block_size;
  uint32_t reserved;
  uint64_t created_ns;
  uint32_t reserved2;
  uint32_t header_crc;  // crc32c of the bytes before it
};
static_assert(sizeof(SegmentHeader) == 40);

struct RecordHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint32_t key_len;
  uint32_t segment_id;
  uint64_t offset;
  uint64_t value_len;
  uint64_t generation;
  uint64_t seq;
  uint32_t value_crc;
  uint32_t key_crc;
  uint32_t reserved;
  uint32_t header_crc;  // crc32c of bytes [0, 60)
};
static_assert(sizeof(RecordHeader) == 64);
constexpr uint64_t kHeaderBytes = sizeof(RecordHeader);

constexpr uint64_t AlignUp(uint64_t v) { return (v + kBlockSize - 1) & ~(kBlockSize - 1); }
// Bytes a record occupies (header + key + value, padded). Callers bound key/value first.
constexpr uint64_t RecordBytes(uint64_t key_len, uint64_t value_len) {
  return AlignUp(kHeaderBytes + key_len + value_len);
}

void SealRecordHeader(RecordHeader* h);  // fills header_crc
void SealSegmentHeader(SegmentHeader* h);
// Why a header block does not parse, or nullptr if it is valid for (segment_id,
// offset) in a file of file_size bytes (all lengths bounded before use).
const char* CheckRecordHeader(const RecordHeader& h, uint32_t segment_id, uint64_t offset,
                              uint64_t file_size);
const char* CheckSegmentHeader(const SegmentHeader& h, uint32_t segment_id);

// 4 KiB-aligned heap buffer (O_DIRECT needs aligned memory).
struct AlignedFree {
  void operator()(void* p) const { free(p); }
};
using AlignedBuf = std::unique_ptr<uint8_t[], AlignedFree>;
AlignedBuf AllocAligned(uint64_t bytes);
// A per-thread staging buffer of at least `bytes` (grown, kept). Slots: 0 read
// chunks, 1 append staging, 2 a record's block 0, 3 the io_uring window.
constexpr int kThreadBuffers = 4;
uint8_t* ThreadBuffer(int which, uint64_t bytes);
constexpr uint64_t kChunkBytes = 4ull << 20;

// Full pread/pwrite (EINTR, short transfers). Return 0 or an errno value;
// PreadFull reports a short file as ENODATA.
int PreadFull(int fd, void* buf, uint64_t len, uint64_t off);
// Reads up to len bytes, stopping at end of file; *got = bytes read.
int PreadUpTo(int fd, void* buf, uint64_t len, uint64_t off, uint64_t* got);
int PwriteFull(int fd, const void* buf, uint64_t len, uint64_t off);
// Opens with O_DIRECT when `direct` and the fs accepts it; *direct_out says which.
// `mode` applies when flags create the file (then also set exactly: SetFileMode).
int OpenMaybeDirect(const std::string& path, int flags, bool direct, bool* direct_out, uint32_t mode = 0600);
// fchmod to `mode` exactly (whatever the umask) and fchown to `group` (-1: unchanged). 0 or errno.
int SetFileMode(int fd, uint32_t mode, int64_t group);
// At most one log line a second per limiter; Allow() returns how many were
// suppressed since the last one through *suppressed. Under the owner's lock.
struct LogLimit {
  uint64_t last_ns = 0, suppressed = 0;
  bool Allow(uint64_t* suppressed_out);
};
int FsyncDir(const std::string& dir);
// Whether name is "seg-XXXXXXXX.mcxl"; its id.
bool ParseSegmentName(std::string_view name, uint32_t* id);

// Reads the record at (segment_id, offset) of fd (a file of file_size bytes)
// and verifies header, key (== `key`), value crc. `expect` (optional) must
// match the header's value_len/crc32c/generation/key_len. The value goes to
// dst (if not null); raw (if set) sees the record image chunk by chunk
// (pos within the record, bytes; kChunkBytes-sized, block aligned) and
// returns false to abort. `aligned` = fd is O_DIRECT (block-sized reads into
// aligned buffers). *why names a failure for the log line.
struct RawSink {
  virtual ~RawSink() = default;
  virtual bool Chunk(uint64_t pos, uint8_t* data, uint64_t n) = 0;
};
Status ReadVerified(int fd, bool aligned, uint32_t segment_id, uint64_t offset, uint64_t file_size,
                    std::string_view key, const RecordLocation* expect, void* dst, RawSink* raw,
                    RecordHeader* hdr_out, const char** why);

// Process-wide reader counters (disk_tier_read.cc).
void CountChecksumFailure();
// Drops a cached reader fd of a deleted segment (same process).
void ForgetReaderFd(const std::string& path);

}  // namespace mcxl::tier

#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace mcxl::tier {

struct SegmentState {
  uint64_t end = 0;   // bytes of the file in use (block aligned, header included)
  uint64_t live = 0;  // bytes of live records and needed tombstones
};

struct KeyState {
  RecordLocation live;       // segment_id 0 = none
  uint64_t live_seq = 0;
  uint64_t tomb_gen = 0;     // max generation over this key's tombstones on disk
  uint32_t tomb_seg = 0;     // the newest tombstone (0 = none tracked)
  uint64_t tomb_off = 0;
  bool tomb_live = false;    // its bytes count live: needed while dead_values > 0
  uint32_t dead_values = 0;  // value records of the key on disk that are not live
  uint32_t tombs = 0;        // tombstones of the key on disk
};

// Writes one record image of `total` bytes at `base` of fd, chunks in order.
// A single-chunk record is one pwrite (in Finish, header patched in); a longer
// one is written body first and block 0 (the header) last. Either way only
// the record being written when the process dies can be torn, and rebuild
// verifies the value crc of a segment's last record (disk_tier_open.cc).
struct ImageWriter {
  int fd = -1;
  uint64_t base = 0;
  uint64_t total = 0;
  uint8_t* block0 = nullptr;  // kBlockSize, aligned
  uint8_t* single = nullptr;  // the whole record, when it came as one chunk
  int err = 0;
  void Put(uint64_t pos, uint8_t* data, uint64_t n);  // n block aligned; data aligned
  int Finish(const RecordHeader& h);
};

// ---- record images (disk_tier_record.cc) ----
// A record header with everything but value_crc (the caller sets it, then seals).
RecordHeader NewRecordHeader(uint16_t kind, std::string_view key, uint32_t seg, uint64_t off,
                             uint64_t value_len, uint64_t generation, uint64_t seq);
// Fills record image bytes [pos, pos + n) into out: header placeholder, key,
// value, zero padding; value bytes are crc'd in order as copied.
void FillImage(uint8_t* out, uint64_t pos, uint64_t n, std::string_view key, const uint8_t* value,
               uint64_t len, uint32_t* crc);
// Writes the record *h names (key, then h->value_len bytes of value) at
// h->offset of fd through an ImageWriter, staged kChunkBytes at a time in
// `stage` (block0: kBlockSize), aligned buffers; fills in h's value_crc and
// seals it; fdatasync after when `sync`. 0 or an errno value.
int WriteImage(int fd, uint8_t* stage, uint8_t* block0, bool sync, RecordHeader* h, std::string_view key,
               const uint8_t* value);
// The sealed image of one record (RecordBytes(key, len) bytes) at out, for a
// write of records packed back to back; its header.
RecordHeader PackRecord(uint8_t* out, uint16_t kind, std::string_view key, const uint8_t* value, uint64_t len,
                        uint32_t seg, uint64_t off, uint64_t generation, uint64_t seq);

struct CompactCursor {
  uint32_t victim = 0;
  uint64_t cursor = 0;
  uint64_t file_size = 0;
  int fd = -1;
  bool direct = false;
  std::vector<std::string> dead_values;                   // applied when the victim is gone
  std::vector<std::pair<std::string, uint64_t>> dropped;  // tombstones not copied (key, offset)
};

struct DiskTier::Impl {
  Options opt;
  std::mutex cmu;          // one Compact at a time
  mutable std::mutex wmu;  // serializes mutations; held over their I/O
  mutable std::mutex mu;   // the state below; never held over I/O (mutators hold wmu too)
  std::map<uint32_t, SegmentState> segs;
  std::unordered_map<std::string, KeyState> keys;
  uint32_t active_id = 0;  // 0 = none yet (created by the first write)
  int active_fd = -1;
  bool active_direct = false;
  uint32_t next_seg_id = 1;
  uint64_t next_seq = 1;
  uint64_t max_gen = 0;
  uint64_t used = 0;
  uint64_t objects = 0;
  uint64_t appends = 0, compactions = 0, relocations = 0;
  bool logged_full = false;
  // Space (disk_tier_space.cc): the capacity the filesystem leaves (under mu).
  uint64_t cap_eff = 0, fs_avail = 0;
  bool fs_full = false;
  uint64_t enospc = 0, damage_dropped = 0, write_errors = 0;
  LogLimit write_log;  // write failures (under wmu)
  int lock_fd = -1;    // <root_dir>/lock.mcxl, flock()ed while open
  uint64_t reserve_bytes = 0;  // <root_dir>/reserve.mcxl, fallocated
  bool reserve_held = false;
  RelocationCallback reloc_cb;
  std::function<void(const char*)> hook;
  CompactCursor cc;

  ~Impl();
  void Hook(const char* point) {
    if (hook) hook(point);
  }
  // Places `bytes` at the end of the active segment (rolling to a new one when
  // full). Under wmu. Compaction copies may exceed capacity (freed right after).
  Status Reserve(uint64_t bytes, bool compaction, uint32_t* seg, uint64_t* off);
  void Unreserve(uint32_t seg, uint64_t off, uint64_t bytes);  // the last Reserve, on a failed write
  Status CreateSegment();
  // The reserve file keeps filesystem space for tombstones and compaction
  // copies: released on ENOSPC there (once), re-taken after a compaction.
  bool ReleaseReserve();
  void HoldReserve();
  // Moves the newest tombstone's bytes between live and dead as dead_values says. Under mu.
  void Reaccount(KeyState& st, size_t key_len);
  void MaybeErase(std::unordered_map<std::string, KeyState>::iterator it);
  void AddLive(uint32_t seg, int64_t delta);
  // statvfs into cap_eff/fs_avail. Under wmu; takes mu.
  void RefreshSpace();
  // A write failed with errno e (under wmu): counted; one log line a second
  // at most; on ENOSPC the space is re-read and the active segment sealed.
  void WriteFailed(int e, const char* what, uint32_t seg, uint64_t off);
  void SealActive();  // under wmu: fdatasync + close; the next write starts a segment
};

// NO_AVAILABLE_HANDLE for a full filesystem (ENOSPC, EDQUOT), else WRITE_FAIL (disk_tier_space.cc).
ErrorCode WriteErrorCode(int err);

}  // namespace mcxl::tier
