// Pool: a CXL memory pool mapped into this process.
//
// Contract: Open maps a device-DAX node, a regular file or a /dev/shm file
// MAP_SHARED. Its size is `size` when non-zero (the device must be at least
// that large), else the device's own size (sysfs for device-DAX, st_size for
// files). Format writes a fresh superblock and zeroes the tables; Verify checks
// an existing one. Every mismatch is INVALID_PARAMS with a log line naming
// what differs; nothing is ever re-formatted silently.
// File modes (access control): a pool file Open creates is mode 0600, or
// 0660 owned by PoolFileOptions::group; Format refuses a pool that others may
// read or write (S_IROTH/S_IWOTH) unless FormatOptions::allow_world_readable.
// Format writes a fresh random credential (Superblock::auth_token).
//
// Thread safety: a Pool is immutable after Open; accessors are thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "mooncake_cxl/error_code.h"
#include "mooncake_cxl/layout.h"

namespace mcxl {

struct FormatOptions {
  uint64_t index_capacity = 0;  // entries; 0 = derived from the pool size
  uint32_t client_slots = 64;
  uint32_t pins_per_client = 1024;
  uint64_t ring_bytes_per_client = 32 * 1024;  // per direction, header included
  CoherenceMode coherence = CoherenceMode::kCoherent;
  bool allow_world_readable = false;  // --allow_world_readable_pool
};

struct PoolFileOptions {
  std::string group;  // --pool_group: a created file is 0660 and owned by this group
};

// Index capacity used when FormatOptions::index_capacity is 0: one entry per
// 4 KiB of pool, at least 1024, rounded up to a power of two (the master
// refuses inserts beyond 7/8 of it).
uint64_t DefaultIndexCapacity(uint64_t pool_size);

constexpr uint64_t kMinPoolSize = 4ull << 20;

class Pool {
 public:
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Maps `path`. create: make a regular file of `size` if it does not exist.
  static Result<std::unique_ptr<Pool>> Open(const std::string& path, uint64_t size,
                                            bool create, const PoolFileOptions& file = {});

  bool IsFormatted() const;
  Status Format(const FormatOptions& options);
  // Checks magic, layout version, size and region table. `expected_uuid`
  // (16 bytes) is compared when non-null.
  Status Verify(const uint8_t* expected_uuid) const;

  char* base() const { return base_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // st_mode of the device or file when opened (after Open created it).
  mode_t file_mode() const { return mode_; }
  Superblock* superblock() const { return reinterpret_cast<Superblock*>(base_); }
  IndexEntry* index() const {
    return reinterpret_cast<IndexEntry*>(base_ + superblock()->index_offset);
  }
  ClientSlot* client_slot(uint32_t i) const {
    return reinterpret_cast<ClientSlot*>(base_ + superblock()->client_table_offset +
                                         uint64_t(i) * sizeof(ClientSlot));
  }
  PinRecord* pin_table(uint32_t client) const {
    const Superblock* sb = superblock();
    return reinterpret_cast<PinRecord*>(base_ + sb->pin_table_offset +
                                        uint64_t(client) * sb->pins_per_client * sizeof(PinRecord));
  }
  // Client `client`'s request (dir 0) or response (dir 1) ring.
  RingHeader* ring(uint32_t client, int dir) const {
    const Superblock* sb = superblock();
    return reinterpret_cast<RingHeader*>(base_ + sb->ring_region_offset +
                                         (uint64_t(client) * 2 + uint64_t(dir)) * sb->ring_bytes);
  }
  // True when [offset, offset+len) lies inside the data region.
  bool InDataRegion(uint64_t offset, uint64_t len) const;
  template <typename T>
  T* At(uint64_t offset) const { return reinterpret_cast<T*>(base_ + offset); }

  std::string UuidString() const;

 private:
  Pool(std::string path, char* base, uint64_t size, mode_t mode)
      : path_(std::move(path)), base_(base), size_(size), mode_(mode) {}
  std::string path_;
  char* base_;
  uint64_t size_;
  mode_t mode_;
};

std::string UuidToString(const uint8_t* uuid);

}  // namespace mcxl
