// Pool: a CXL memory pool mapped into this process.
//
// Contract: Open maps a device-DAX node, a regular file or a /dev/shm file
// MAP_SHARED. Its size is `size` when non-zero (the device must be at least
// that large), else the device's own size (sysfs for device-DAX, st_size for
// files). Format writes a fresh superblock and zeroes the tables; Verify checks
// an existing one, field by field with overflow-safe arithmetic, against the
// mapped size. Every mismatch is INVALID_PARAMS with a log line naming the
// field; nothing is ever re-formatted silently.
// File modes (access control): a pool file Open creates is mode 0600, or
// 0660 owned by PoolFileOptions::group; Format refuses a pool that others may
// read or write (S_IROTH/S_IWOTH) unless FormatOptions::allow_world_readable.
// Format writes a fresh random credential (Superblock::auth_token).
//
// The superblock lives in memory every client can write: Format and Verify
// copy its region table into the Pool (Geometry), and every accessor below
// (index(), client_slot(), pin_table(), ring(), announce_channel(), InDataRegion) uses that copy,
// never the shared words, so a later store into the superblock cannot move a
// region or stretch a bound. Callers check their slot/record indices against
// geometry() counts.
//
// The device can shrink under us (a truncated file, a failed device). The
// Pool keeps its fd: CheckSize() compares the device's size with the mapping
// (fstat, or sysfs for device-DAX), and once it is smaller the pool is
// failed() for good. InstallPoolFaultHandler catches SIGBUS inside any open
// Pool's mapping (see below).
//
// Simulated hosts (coherence_sim.h): with MC_CXL_SIM_HOST set, Open maps
// the host copy of the pool instead of the pool file (base() is the copy;
// fd() stays the pool file's), and Format and Verify refuse a pool not
// formatted --coherence=noncoherent. Format, Verify and IsFormatted move
// their lines through the simulator themselves (they run before the
// process's SetCoherenceMode).
//
// Thread safety: a Pool is immutable after Verify/Format but for the failed
// flag (atomic); accessors are thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/pool/layout.h"

namespace mcxl {

class SimHost;

struct FormatOptions {
  uint64_t index_capacity = 0;  // entries; 0 = derived from the pool size
  uint32_t client_slots = 64;
  uint32_t pins_per_client = 1024;
  uint64_t ring_bytes_per_client = 32 * 1024;  // per direction, header included
  CoherenceMode coherence = CoherenceMode::kCoherent;
  bool allow_world_readable = false;  // --allow_world_readable_pool
  // announce.h; 0 = two per client slot, at most what 1/16 of the pool holds (>= 8)
  uint32_t announce_channels = 0;
  uint32_t announce_slots = 512;      // records per channel, a power of two
};

struct PoolFileOptions {
  std::string group;  // --pool_group: a created file is 0660 and owned by this group
};

// Index capacity used when FormatOptions::index_capacity is 0: one entry per
// 4 KiB of pool, at least 1024, rounded up to a power of two. The master
// evicts past --index_high_watermark_ratio (0.8) of it in use, so this suits
// objects of 5 KiB or more on average (64 bytes of pool per entry, 1.6 %).
uint64_t DefaultIndexCapacity(uint64_t pool_size);
// Channels used when FormatOptions::announce_channels is 0: two per client
// slot (a producer and a listener each), at most what 1/16 of the pool
// holds, at least 8.
uint32_t DefaultAnnounceChannels(uint32_t client_slots, uint64_t pool_size, uint32_t announce_slots);

constexpr uint64_t kMinPoolSize = 4ull << 20;
// Bounds Verify puts on the superblock's counts (Format never exceeds them).
constexpr uint32_t kMaxClientSlots = 4096;
constexpr uint32_t kMaxPinsPerClient = 1u << 20;
constexpr uint64_t kMaxRingBytes = 1ull << 30;
constexpr uint32_t kMaxAnnounceChannels = 8192;
static_assert(kMaxClientSlots == kAnnounceHolderWords * 64);
constexpr uint32_t kMaxAnnounceSlots = 1u << 20;
// Bytes of one announcement channel (header + records).
constexpr uint64_t AnnounceChannelBytes(uint32_t slots) {
  return sizeof(AnnounceChannelHeader) + uint64_t(slots) * sizeof(AnnounceRecord);
}

// The superblock's region table as Format wrote it and Verify checked it: a
// private copy (see the contract above).
struct PoolGeometry {
  uint64_t pool_size = 0;
  uint64_t client_table_offset = 0;
  uint32_t client_slot_count = 0;
  uint64_t pin_table_offset = 0;
  uint32_t pins_per_client = 0;
  uint32_t ring_bytes = 0;
  uint64_t ring_region_offset = 0;
  uint64_t index_offset = 0;
  uint64_t index_capacity = 0;
  uint64_t data_offset = 0;
  uint64_t data_size = 0;
  CoherenceMode coherence = CoherenceMode::kCoherent;
  uint8_t uuid[16] = {};
  uint64_t announce_offset = 0;
  uint32_t announce_channels = 0;
  uint32_t announce_slots = 0;
  bool operator==(const PoolGeometry&) const = default;
};

// SIGBUS in an open Pool's mapping (the device shrank or failed under us).
//   kExit (the master): one line on stderr (write(2)) naming the pool offset
//     and, when the file shrank, "pool device shrank from X to Y bytes", then
//     _exit(kPoolLostExitCode): nothing the master holds is trustworthy.
//   kRemap (a client library in a user's process): the pool is marked
//     failed, the pages from the faulting one to the end of the mapping are
//     replaced by anonymous zero pages, and the access is retried; every call
//     then fails with UNAVAILABLE_IN_CURRENT_STATUS (copies re-check failed()
//     after copying, so zeros are never returned as a value).
// Faults outside every Pool mapping go to the handler that was installed
// before (or the default action). Idempotent; the first call's action wins.
enum class PoolFaultAction { kExit, kRemap };
void InstallPoolFaultHandler(PoolFaultAction action);
constexpr int kPoolLostExitCode = 3;

class Pool {
 public:
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Maps `path`. create: make a regular file of `size` if it does not exist.
  static Result<std::unique_ptr<Pool>> Open(const std::string& path, uint64_t size,
                                            bool create, const PoolFileOptions& file = {});

  bool IsFormatted() const;
  // The huge= policy of the tmpfs the pool file lives on ("never" when the
  // mount names none), or "" when it is not on tmpfs. Open() asks for 2 MiB
  // pages (MADV_HUGEPAGE), which tmpfs honours under huge=advise, always or
  // within_size: batch reads of many extents then miss the TLB far less.
  std::string TmpfsHugePolicy() const;
  Status Format(const FormatOptions& options);
  // Checks magic, layout version, size and every field of the region table
  // (named in the log line when wrong). The first successful Verify (or
  // Format) takes the Geometry copy, before the Pool is shared; a later one
  // also fails when the table differs from that copy. `expected_uuid` (16
  // bytes) is compared when non-null.
  Status Verify(const uint8_t* expected_uuid) const;

  char* base() const { return base_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // st_mode of the device or file when opened (after Open created it).
  mode_t file_mode() const { return mode_; }
  // Only the live words (incarnation, heartbeat, lease ttl, max_probe, pids,
  // doorbell) are read from here; the region table comes from geometry().
  Superblock* superblock() const { return reinterpret_cast<Superblock*>(base_); }
  const PoolGeometry& geometry() const { return geo_; }
  IndexEntry* index() const { return reinterpret_cast<IndexEntry*>(base_ + geo_.index_offset); }
  // REQUIRES: i < geometry().client_slot_count.
  ClientSlot* client_slot(uint32_t i) const {
    return reinterpret_cast<ClientSlot*>(base_ + geo_.client_table_offset + uint64_t(i) * sizeof(ClientSlot));
  }
  // REQUIRES: client < geometry().client_slot_count.
  PinRecord* pin_table(uint32_t client) const {
    return reinterpret_cast<PinRecord*>(base_ + geo_.pin_table_offset +
                                        uint64_t(client) * geo_.pins_per_client * sizeof(PinRecord));
  }
  // Client `client`'s request (dir 0) or response (dir 1) ring.
  // REQUIRES: client < geometry().client_slot_count.
  RingHeader* ring(uint32_t client, int dir) const {
    return reinterpret_cast<RingHeader*>(base_ + geo_.ring_region_offset +
                                         (uint64_t(client) * 2 + uint64_t(dir)) * geo_.ring_bytes);
  }
  // Announcement channel i. REQUIRES: i < geometry().announce_channels.
  AnnounceChannelHeader* announce_channel(uint32_t i) const {
    return reinterpret_cast<AnnounceChannelHeader*>(base_ + geo_.announce_offset +
                                                    uint64_t(i) * AnnounceChannelBytes(geo_.announce_slots));
  }
  // True when [offset, offset+len) lies inside the data region (overflow-safe).
  bool InDataRegion(uint64_t offset, uint64_t len) const {
    return offset >= geo_.data_offset && len <= geo_.data_size &&
           offset - geo_.data_offset <= geo_.data_size - len;
  }

  // The device's size now (fstat, sysfs for device-DAX); kUnknownSize when
  // it cannot be told (then CheckSize assumes it did not shrink).
  static constexpr uint64_t kUnknownSize = UINT64_MAX;
  uint64_t DeviceSize() const;
  // Fails the pool (logged once: "pool device shrank from X to Y bytes") when
  // the device is now smaller than the mapping; false once failed.
  bool CheckSize();
  // True once the device shrank or a SIGBUS hit the mapping: nothing in the
  // mapping may be trusted any more (seq_cst: see failed_; a plain load on x86).
  bool failed() const { return failed_.load(std::memory_order_seq_cst); }
  void MarkFailed() { failed_.store(true, std::memory_order_seq_cst); }
  int fd() const { return fd_; }
  template <typename T>
  T* At(uint64_t offset) const { return reinterpret_cast<T*>(base_ + offset); }

  std::string UuidString() const;
  // The simulated host this pool is mapped through, or null.
  SimHost* sim() const { return sim_.get(); }

 private:
  Pool(std::string path, int fd, char* base, uint64_t size, mode_t mode, std::unique_ptr<SimHost> sim);
  // Format's and Verify's own write-back / invalidate: before the process
  // chose its primitives (SetCoherenceMode), so by the pool's mode.
  void WriteBackOwn(const void* p, size_t n, CoherenceMode mode) const;
  void InvalidateOwn(const void* p, size_t n) const;
  Status CheckSimMode(CoherenceMode mode) const;
  void NameSimRegions() const;  // the checker's log lines name regions
  std::string path_;
  int fd_;  // kept open for DeviceSize
  char* base_;
  uint64_t size_;
  mode_t mode_;
  // Set once by Format or the first Verify (see there), then read-only.
  mutable PoolGeometry geo_;
  mutable bool geo_set_ = false;
  // seq_cst: the fault handler stores it before it remaps; a thread that
  // copied remapped zeros loads it after its copy and sees it (see kRemap).
  std::atomic<bool> failed_{false};
  std::unique_ptr<SimHost> sim_;  // owns the host copy mapped at base_
};

std::string UuidToString(const uint8_t* uuid);

}  // namespace mcxl
