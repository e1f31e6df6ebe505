// TierHost: what the SSD tier (TierManager) needs from the master, and
// nothing more. The master is the pool's only structural writer, so every
// change to an index entry or an extent the tier wants is asked of it here;
// the tier itself only reads entries, copies value bytes out of an object
// (demotion) and into an extent handed to it (promotion), and keeps its own
// records (disk locations, queues, tombstones).
//
// Locking: every method but mu() REQUIRES mu() held; the tier takes it for
// short steps and never holds it across disk I/O. Slots are index slots;
// extents are named by the master's allocator handles.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake_cxl/master/master_fence.h"
#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/pool/extent_allocator.h"
#include "mooncake_cxl/pool/object_index.h"
#include "mooncake_cxl/tier/disk_tier.h"

namespace mcxl {

class TierHost {
 public:
  // The master's records of a slot (extent and key_len mean something only
  // while live: the master inserted or recovered the entry there).
  struct EntryRecord {
    bool live = false;
    uint64_t extent = 0;  // allocator handle
    uint32_t key_len = 0;
  };
  // A fresh extent holding header + key of a promoted object, its value
  // bytes still to be written at `value` (only the tier writes them).
  struct PromotionTarget {
    Extent extent;
    char* value = nullptr;
  };

  // ---- the lock ----
  virtual FencedMutex& mu() const = 0;  // the master's one lock

  // ---- looking at entries ----
  virtual const ObjectIndex& index() const = 0;
  virtual const ExtentAllocator& alloc() const = 0;
  virtual bool pool_lost() const = 0;
  virtual EntryRecord Record(uint64_t slot) const = 0;
  virtual std::string_view KeyOf(uint64_t slot) const = 0;
  // The value bytes of a live pool object (nullptr when the master holds no
  // extent for it): stable while its extent is kept (TakeOverFree).
  virtual const char* ValueBytes(uint64_t slot) const = 0;
  // Live (WRITING or COMPLETE) entries of `key`; corrupt ones are left out.
  virtual void FindLive(std::string_view key, uint64_t hash, std::vector<uint64_t>* out) const = 0;
  // The entry agrees with the master's records; else it is quarantined.
  virtual bool CheckedLive(uint64_t slot) const = 0;
  // Eviction's view: last access (lease or put time), an active soft pin, a
  // newer put of the key still WRITING, the slot's group, a random slot to
  // start a sampled scan at, a view pinning `generation`.
  virtual uint64_t LastAccessNs(uint64_t slot, uint64_t ttl_ns) const = 0;
  virtual bool SoftPinActive(uint64_t slot, uint64_t now) const = 0;
  virtual bool NewerWriting(uint64_t slot) const = 0;
  virtual std::vector<uint64_t> GroupMembers(uint64_t slot) const = 0;
  virtual uint64_t RandomSlot() = 0;
  virtual bool IsPinned(uint64_t generation) const = 0;

  // ---- changing entries ----
  // COMPLETE `slot` whose value `loc` holds becomes kOnDisk: same slot and
  // generation, its extent replaced by a stub (ObjectHeader + key +
  // DiskStub). False when it changed, is corrupt, leased, pinned or its
  // extent busy; *bytes gains the pool bytes freed.
  virtual bool ConvertToDisk(uint64_t slot, const tier::RecordLocation& loc, uint64_t* bytes) = 0;
  // The stub of kOnDisk `slot` names `loc` (relocation, recovery).
  virtual void RewriteStub(uint64_t slot, const tier::RecordLocation& loc) = 0;
  // An extent for kOnDisk `slot`'s value below the pool's watermark (an
  // eviction round first when needed), its header and key written.
  virtual Result<PromotionTarget> AllocateForPromotion(uint64_t slot) = 0;
  // Links the filled extent: kOnDisk -> COMPLETE, same generation; the stub goes.
  virtual void LinkPromoted(uint64_t slot, const Extent& extent) = 0;
  virtual void FreeExtent(uint64_t handle) = 0;
  // Frees an extent now, or once no view pins `generation`.
  virtual void FreeWhenUnpinned(uint64_t handle, uint64_t generation) = 0;
  virtual void UnlinkNow(uint64_t slot) = 0;
  // Unlinks `slot` with the older values of its key; returns entries unlinked.
  virtual uint64_t UnlinkWithOlder(uint64_t slot, uint64_t* bytes) = 0;
  // Evicts slot's whole group now, as eviction without a tier would.
  virtual void DropGroup(uint64_t slot) = 0;
  // After --format: a kOnDisk entry for a record of the segment files; its
  // slot, or an error when the pool or the index has no room for its stub.
  virtual Result<uint64_t> InsertOnDisk(const std::string& key, const tier::RecordLocation& loc, uint64_t now) = 0;
  // New generations start above `generation`.
  virtual void ReserveGeneration(uint64_t generation) = 0;
  // Superblock::tier_tombs_durable: read, and raised (release + publish).
  virtual uint64_t TombsDurable() const = 0;
  virtual void PublishTombsDurable(uint64_t seq) = 0;

 protected:
  ~TierHost() = default;
};

}  // namespace mcxl
