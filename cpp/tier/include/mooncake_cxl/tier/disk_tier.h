// DiskTier: the SSD tier's segment files, below the CXL pool.
//
// Contract. Objects are appended as records to large segment files
// `<root_dir>/seg-<segment_id as 8 hex digits>.mcxl` (ids start at 1, never
// reused while a higher id exists). A restart rebuilds the tier's index from
// the files alone (Open). Records are immutable once Append returned their
// RecordLocation; only compaction rewrites them elsewhere (and reports it).
//
// On-disk format (little-endian, every unit 4 KiB = kBlockSize aligned, so
// O_DIRECT works; see disk_tier_internal.h for the structs):
//   block 0 of a segment: SegmentHeader {magic "MCXLSEG1", version 1,
//     segment_id, block_size, created_ns, crc32c of the preceding bytes}.
//   then records, each starting on a block boundary:
//     RecordHeader (64 B): magic 'MCXR', version 1, kind (1 value, 2
//       tombstone), key_len, segment_id + offset (where it was written: a
//       stale or misplaced header never passes), value_len, generation, seq
//       (append order, tie-break among equal generations), crc32c of the
//       value, crc32c of the key, crc32c of the header's first 60 bytes;
//     key bytes; value bytes; zero padding to the next block. The header's
//     `reserved` word has bit 0 set on compaction copies (kept seq).
//   <root_dir>/lock.mcxl: flock()ed by the one DiskTier that has the
//     directory open; holds its pid, host and Options::owner.
//   Files are Options::file_mode exactly (directory: the same with x bits),
//   in Options::group; a root_dir others may access is refused.
//   Writes are serialized, so a crash can tear only the record being
//   written: one pwrite for a record of up to 4 MiB, else body first and
//   block 0 (the header) last. AppendBatch writes consecutive records of up
//   to 4 MiB in all as ONE pwrite (same per-record format): a crash tears
//   only records of that batch, the ones rebuild then skips (a record cut
//   short is not followed by a valid header, so its value crc decides).
// Rebuild: every segment is scanned; a block that is not a valid header
// (torn write, flipped byte, hole) is skipped block by block. A record found
// after such a gap, or not directly followed by another valid header (a
// segment's tail, where a torn write would be), must also pass its value crc
// before it counts. Per key the newest (generation, seq) value record wins; a
// tombstone of generation G hides every value record of the key with
// generation <= G. Stale copies (compaction crashed before deleting its
// victim) are ordinary dead records. A damaged block where a record header
// must be (not all zeros: a torn write leaves zeros or a short file; not a
// readable value header) may have been a tombstone: every value record
// appended before it (seq below the first fresh record after it; all of
// them when none follows) is dropped and tombstoned (Stats::damage_dropped).
// Full filesystem: the capacity used is min(capacity_bytes, what statvfs
// leaves: used + free - 1/64 of the filesystem - half a segment - the
// reserve file when released); an append that meets
// ENOSPC anyway seals the active segment (compactable) and refreshes it.
// Failed writes are counted (Stats::write_errors, enospc) and logged at most
// once a second.
//
// Durability policy: Append/Remove return after the write completed (pwrite,
// O_DIRECT where supported), which survives a SIGKILL of the writer process.
// fdatasync runs when a segment is sealed (full), before compaction deletes a
// segment, and after every record when Options::sync_each_append (power-loss
// durability; without it a power loss can lose or tear the last records,
// which rebuild skips or a read reports as CHECKSUM_MISMATCH, never as bytes).
// Directory entries are fsynced on segment creation and deletion.
//
// Reads (ReadRecord) verify everything: header crc, location, key, length,
// generation, value crc32c. Any mismatch is an error code, one log line and
// a process-wide counter (ReaderCounters); dst's contents are then
// unspecified and must not be used.
//
// Thread safety: DiskTier is thread-safe; mutations are serialized (one I/O in
// flight per tier: a caller waits at most for the current record's I/O).
// ReadRecord is thread-safe and usable from any process that can open root_dir.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake_cxl/common/error_code.h"

namespace mcxl::tier {

constexpr uint64_t kBlockSize = 4096;
constexpr uint32_t kMaxTierKeyLength = 65535;        // = layout.h kMaxKeyLength
constexpr uint64_t kMaxTierValueLength = 1ull << 36;  // 64 GiB: sanity bound on lengths read from files

// Where one record lives. Trivially copyable (tier-core stores it in the pool).
// segment_id 0 means "no record".
struct RecordLocation {
  uint32_t segment_id = 0;
  uint32_t reserved = 0;
  uint64_t offset = 0;  // of the record header in its segment file
  uint64_t value_len = 0;
  uint32_t crc32c = 0;  // of the value
  uint32_t key_len = 0;
  uint64_t generation = 0;
  bool operator==(const RecordLocation&) const = default;
};
static_assert(sizeof(RecordLocation) == 40);

struct Options {
  std::string root_dir;
  uint64_t capacity_bytes = 0;           // bound on the sum of segment file sizes (appends)
  uint64_t segment_bytes = 256ull << 20;  // a segment is sealed when the next record would not fit
  bool direct_io = true;   // O_DIRECT where the fs supports it (tmpfs does not: fall back, log once)
  bool io_uring = false;   // unused by the writer; ReadRecord uses io_uring for records of
                           // >= 2 MiB on O_DIRECT fds (MCXL_TIER_IO_URING=0 turns it off)
  double compact_garbage_ratio = 0.5;  // a segment is a compaction victim at dead/size >= this
  bool sync_each_append = false;       // fdatasync after every record (power-loss durability)
  // Filesystem space kept aside in <root_dir>/reserve.mcxl (fallocated, not
  // counted in used_bytes) so that on a full filesystem removes (tombstones)
  // and compaction can still write: released on ENOSPC there, re-taken after
  // the next compaction. ~0 = min(segment_bytes, 64 MiB); 0 = none; never
  // more than 1/8 of the free space (halved until fallocate succeeds).
  uint64_t reserve_bytes = ~0ull;
  uint32_t file_mode = 0600;          // segment, reserve and lock files (the directory adds x bits)
  int64_t group = -1;                 // their group (--pool_group); -1 = the process's
  bool allow_world_readable = false;  // else Open refuses a root_dir with any permission for others
  std::string owner;                  // recorded in lock.mcxl (the master's pool uuid): named to a second opener
};

struct Stats {
  uint64_t capacity = 0, used_bytes = 0, live_bytes = 0, objects = 0, segments = 0;
  uint64_t appends = 0, reads = 0, checksum_failures = 0, compactions = 0;
  uint64_t relocations = 0;   // records moved by compaction (extension)
  bool direct_io = false;     // the active segment is written with O_DIRECT (extension)
  uint64_t capacity_effective = 0;  // min(capacity, the filesystem's room) as of the last RefreshSpace
  uint64_t fs_free_bytes = 0;       // statvfs f_bavail of root_dir then
  bool fs_full = false;             // ... below 1/128 of the filesystem: something else filled it
  uint64_t enospc = 0;              // writes that met ENOSPC/EDQUOT
  uint64_t damage_dropped = 0;      // records dropped at Open: appended before a damaged block
  uint64_t write_errors = 0;        // failed writes (every one; the log is rate-limited)
};

// Process-wide counters of ReadRecord (relaxed atomics underneath: statistics).
struct ReaderCounters {
  uint64_t reads = 0, bytes = 0, checksum_failures = 0, errors = 0, direct_reads = 0;
  uint64_t uring_reads = 0;  // records of >= 2 MiB read through io_uring (O_DIRECT fds)
};
ReaderCounters GetReaderCounters();

using RelocationCallback =
    std::function<void(std::string_view key, const RecordLocation& old_loc, const RecordLocation& new_loc)>;

class DiskTier {
 public:
  // Creates root_dir if needed, scans its segments, rebuilds the index.
  // Appends go to a fresh segment (or the newest one if it holds no record).
  static Result<std::unique_ptr<DiskTier>> Open(const Options& options);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Appends key + value as one record; returns its location after the write
  // completed. INVALID_PARAMS: empty/oversized key or value; INVALID_VERSION:
  // generation older than the key's live record or <= a tombstone of the key;
  // NO_AVAILABLE_HANDLE: capacity_bytes or the filesystem is full (nothing
  // counted live); WRITE_FAIL: other I/O errors.
  Result<RecordLocation> Append(std::string_view key, const void* value, uint64_t len,
                                uint64_t generation);
  // Appends many records, packed back to back in one aligned write per up to
  // 4 MiB (the demotion path: one syscall instead of one per 64 KiB record).
  // Each item gets Append's result (same codes); a record that fails its
  // checks does not stop the others; an I/O error fails the records of that
  // write only. Items larger than 1 MiB, repeated keys and a batch that does
  // not fit the capacity as a whole fall back to Append one by one.
  struct BatchItem {
    std::string_view key;
    const void* value = nullptr;
    uint64_t len = 0;
    uint64_t generation = 0;
  };
  std::vector<Result<RecordLocation>> AppendBatch(const std::vector<BatchItem>& items);
  // Durable removal: writes a tombstone when the key has a live record with
  // generation <= `generation` (else nothing to hide: OK, no write). A
  // tombstone (one block) may go above capacity_bytes: it turns its record dead.
  Status Remove(std::string_view key, uint64_t generation);
  // Many Removes, their tombstones packed back to back in one write per up
  // to 4 MiB (group commit: the master's removes wait for their tombstone).
  // Each item gets Remove's result; a repeated key or a failed packed write
  // falls back to Remove one by one.
  std::vector<Status> RemoveBatch(const std::vector<std::pair<std::string_view, uint64_t>>& items);
  // The live records. Called under the tier's state lock: the callback must
  // not call back into this DiskTier.
  void ForEachLive(const std::function<void(std::string_view key, const RecordLocation&)>& fn) const;
  // The live location of `key` (OBJECT_NOT_FOUND if none). Extension.
  Result<RecordLocation> Lookup(std::string_view key) const;
  uint64_t MaxGeneration() const;  // over every record and tombstone seen (never decreases)
  // Compaction of the segment with the most garbage (dead/size >=
  // compact_garbage_ratio; never the active one). Copies at most about
  // budget_bytes per call (0 = finish the victim) and resumes on the next
  // call; the victim is deleted only after its copies are fdatasynced. OK when
  // there is nothing to do. Relocations are reported through the callback,
  // called WITHOUT the tier's lock after the copy is written: the index should
  // apply (key, old, new) only if its entry still names `old`. new_loc with
  // segment_id 0 means the record failed its checksum and was dropped.
  Status Compact(uint64_t budget_bytes);
  void SetRelocationCallback(RelocationCallback cb);
  Stats stats() const;
  // Re-reads the filesystem's free space (statvfs) into the effective
  // capacity: it shrinks when another program fills the filesystem and
  // grows back when space returns. Cheap; the tier thread calls it often.
  void RefreshSpace();
  const std::string& root_dir() const;

  // Test hook: called at named points ("compact.copied", "compact.synced",
  // "compact.unlinked") so a test can crash there.
  void SetTestHook(std::function<void(const char* point)> hook);

  struct Impl;

 private:
  explicit DiskTier(std::unique_ptr<Impl> impl);
  // Open's drop of the records a damaged block may have hidden (key, generation).
  void DropDamaged(const std::vector<std::pair<std::string, uint64_t>>& drop, uint64_t blocks);
  std::unique_ptr<Impl> impl_;
};

// Reader side (clients that can open root_dir, and the master for promotion):
// opens the segment read-only (cached fd, O_DIRECT where supported), reads
// the record (pread; a record of >= 2 MiB on an O_DIRECT fd as 1 MiB io_uring
// reads, 8 in flight: measured faster for 16 MiB) and verifies it. dst must hold value_len
// (else BUFFER_OVERFLOW). Errors: FILE_NOT_FOUND (segment gone: compacted;
// look the key up again), OBJECT_NOT_FOUND (a valid record of another key or
// generation: stale location), CHECKSUM_MISMATCH (corruption; counted),
// INVALID_PARAMS (location out of bounds), INVALID_READ (I/O error).
Status ReadRecord(const std::string& root_dir, const RecordLocation& loc, std::string_view key,
                  void* dst, uint64_t dst_len);

// Closes ReadRecord's cached fds of segments that were deleted (compacted):
// an open fd keeps a deleted file's space. ReadRecord sweeps on a new
// segment and once a second; a reader idle for long calls this (cheap).
void CloseDeletedReaderFds();

// The segment file name of `segment_id` under root_dir.
std::string SegmentPath(const std::string& root_dir, uint32_t segment_id);

// Software/SSE4.2 crc32c (Castagnoli), chainable: Crc32c(b, Crc32c(a)) == crc of a||b.
uint32_t Crc32c(const void* data, size_t len, uint32_t crc = 0);

}  // namespace mcxl::tier
