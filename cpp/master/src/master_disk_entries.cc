// Entries whose value is in the SSD tier, as the master writes them: the
// master is the pool's only structural writer, so the tier (tier_manager.h)
// asks it (TierHost) to convert an entry to kOnDisk, rewrite its stub,
// allocate and link a promotion, or rebuild entries after --format; and
// kPromote requests reach the tier through it.
//
// A kOnDisk entry keeps its slot and generation; its extent is a stub:
// ObjectHeader + key + DiskStub (layout.h), rewritten under the entry's
// seqlock (BeginRewrite/EndRewrite), so a reader of the old bytes retries.
//
// Atomics follow the three rules stated in master_impl.h.
#include <algorithm>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/publish.h"
#include "master_impl.h"

namespace mcxl {

std::string MasterImpl::HandlePromote(Decoder* d) {
  PromoteRequest req;
  if (!Decode(d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed Promote request rejected");
    return StatusReply(ErrorCode::INVALID_PARAMS);
  }
  if (!ClientValid(req.client)) return StatusReply(ErrorCode::ILLEGAL_CLIENT);
  if (!tier_) return StatusReply(ErrorCode::NOT_SUPPORTED);
  if (req.key.empty() || req.key.size() > kMaxKeyLength) return StatusReply(ErrorCode::INVALID_PARAMS);
  return StatusReply(tier_->Promote(req));
}

TierHost::EntryRecord MasterImpl::Record(uint64_t slot) const {
  const EntryMeta& m = entry_meta_[slot];
  return {m.live, m.extent, m.key_len};
}

const char* MasterImpl::ValueBytes(uint64_t slot) const {
  const EntryMeta& m = entry_meta_[slot];
  Extent ext;
  if (!alloc_->Lookup(m.extent, &ext)) return nullptr;
  return pool_->base() + ext.offset + ObjectHeaderBytes(m.key_len);
}

void MasterImpl::WriteStub(uint64_t stub_offset, uint64_t key_len, const tier::RecordLocation& loc) {
  auto* st = pool_->At<DiskStub>(stub_offset + ObjectHeaderBytes(key_len));
  st->magic = kDiskStubMagic;
  st->segment_id = loc.segment_id;
  st->crc32c = loc.crc32c;
  st->record_offset = loc.offset;
  st->value_len = loc.value_len;
  st->generation = loc.generation;
  st->key_len = uint32_t(key_len);
  st->reserved = 0;
  st->disk_reads.store(0, std::memory_order_relaxed);  // statistic
  PublishRange(st, sizeof(DiskStub));
}

bool MasterImpl::ConvertToDisk(uint64_t slot, const tier::RecordLocation& loc, uint64_t* bytes) {
  IndexEntry& e = index_->entry(slot);
  uint64_t sg = e.state_gen.load(std::memory_order_acquire);
  if (StateOf(sg) != EntryState::kComplete || !CheckedLive(slot)) return false;
  if (loc.generation != GenOf(sg)) return false;
  EntryMeta& m = entry_meta_[slot];
  Extent ext;
  if (!alloc_->Lookup(m.extent, &ext) || tier_->ExtentBusy(m.extent)) return false;
  if (index_->LeaseUntil(slot) > NowNs()) return false;  // a reader just took it: keep it (clean copy stays)
  const ObjectHeader* h = HeaderOf(slot);
  ObjectHeaderFields f;
  f.key_hash = e.key_hash.load(std::memory_order_relaxed);
  f.generation = GenOf(sg);
  f.value_size = e.value_size.load(std::memory_order_relaxed);
  uint64_t stub_bytes = ExtentBytes(m.key_len, sizeof(DiskStub));
  f.put_time_ns = h->put_time_ns;  // values only (see HeaderOf)
  f.group_hash = h->group_hash;
  f.soft_pin_ttl_ms = h->soft_pin_ttl_ms;
  f.flags = (h->flags & (kFlagHardPin | kFlagSoftPin)) | kFlagDiskStub;
  std::string key(KeyOf(slot));
  // The stub gets its own small extent: stubs left inside the freed
  // extents would cut the pool into holes just too small for the next
  // object of the same size. (Small extents pack together: TLSF good fit.)
  // Only when none is free does the object's own extent shrink to it.
  auto stub = alloc_->Allocate(stub_bytes);
  uint64_t stub_offset = stub ? stub->offset : ext.offset;
  f.extent_size = stub ? stub->size : std::min(stub_bytes, ext.size);
  // Odd version first, then the pins (the Dekker pair of ScanPins with
  // PinValue's pin store + version re-check): a view taken meanwhile wins.
  index_->BeginRewrite(slot);
  if (IsPinned(GenOf(sg))) {
    index_->EndRewrite(slot);
    if (stub) (void)alloc_->Free(stub->handle);
    return false;
  }
  WriteObjectHeader(*pool_, stub_offset, f, key);
  WriteStub(stub_offset, m.key_len, loc);
  e.object_offset.store(stub_offset, std::memory_order_relaxed);
  e.state_gen.store(PackStateGen(GenOf(sg), EntryState::kOnDisk), std::memory_order_relaxed);
  index_->EndRewrite(slot);
  uint64_t kept = 0;
  if (stub) {  // after the version bump: readers of the old bytes retry
    (void)alloc_->Free(m.extent);
    m.extent = stub->handle;
    kept = stub->size;
  } else {
    (void)alloc_->Shrink(m.extent, stub_bytes);
    Extent after;
    kept = alloc_->Lookup(m.extent, &after) ? after.size : stub_bytes;
  }
  if (bytes != nullptr) *bytes += ext.size > kept ? ext.size - kept : 0;
  return true;
}

void MasterImpl::RewriteStub(uint64_t slot, const tier::RecordLocation& loc) {
  Extent ext;
  if (!alloc_->Lookup(entry_meta_[slot].extent, &ext)) return;
  index_->BeginRewrite(slot);  // readers holding the old location retry
  WriteStub(ext.offset, entry_meta_[slot].key_len, loc);
  index_->EndRewrite(slot);
}

Result<TierHost::PromotionTarget> MasterImpl::AllocateForPromotion(uint64_t slot) {
  const IndexEntry& e = index_->entry(slot);
  const uint32_t key_len = entry_meta_[slot].key_len;
  const uint64_t value_size = e.value_size.load(std::memory_order_relaxed);
  uint64_t need = ExtentBytes(key_len, value_size);
  uint64_t high = uint64_t(config_.eviction_high_watermark_ratio * double(alloc_->capacity()));
  // Room under the watermark first (eviction converts objects that have a
  // record at once; others are queued and this promotion waits for a later read).
  if (alloc_->used_bytes() + need > high) (void)EvictRound(alloc_->used_bytes() + need - high, 0, "promotion");
  auto a = alloc_->used_bytes() + need <= high ? alloc_->Allocate(need) : Result<Extent>(ErrorCode::NO_AVAILABLE_HANDLE);
  if (!a) return a.error();
  const ObjectHeader* h = HeaderOf(slot);
  ObjectHeaderFields f;
  f.key_hash = e.key_hash.load(std::memory_order_relaxed);
  f.generation = GenOf(e.state_gen.load(std::memory_order_relaxed));
  f.value_size = value_size;
  f.extent_size = a->size;
  f.put_time_ns = h->put_time_ns;
  f.group_hash = h->group_hash;
  f.soft_pin_ttl_ms = h->soft_pin_ttl_ms;
  f.flags = h->flags & (kFlagHardPin | kFlagSoftPin);
  WriteObjectHeader(*pool_, a->offset, f, KeyOf(slot));  // from the stub into the new extent
  return PromotionTarget{*a, pool_->base() + a->offset + ObjectHeaderBytes(key_len)};
}

void MasterImpl::LinkPromoted(uint64_t slot, const Extent& extent) {
  PublishRange(pool_->base() + extent.offset, extent.size);
  IndexEntry& e = index_->entry(slot);
  uint64_t gen = GenOf(e.state_gen.load(std::memory_order_relaxed));
  EntryMeta& m = entry_meta_[slot];
  uint64_t stub = m.extent;
  index_->BeginRewrite(slot);
  e.object_offset.store(extent.offset, std::memory_order_relaxed);
  e.put_time_ns.store(NowNs(), std::memory_order_relaxed);  // fresh in the pool's LRU
  e.state_gen.store(PackStateGen(gen, EntryState::kComplete), std::memory_order_relaxed);
  index_->EndRewrite(slot);
  m.extent = extent.handle;
  (void)alloc_->Free(stub);  // after the version bump: stub readers retry
}

void MasterImpl::FreeWhenUnpinned(uint64_t handle, uint64_t generation) {
  if (IsPinned(generation)) pinned_.push_back({handle, generation});
  else (void)alloc_->Free(handle);
}

Result<uint64_t> MasterImpl::InsertOnDisk(const std::string& key, const tier::RecordLocation& loc, uint64_t now) {
  uint64_t need = ExtentBytes(key.size(), sizeof(DiskStub));
  if (live_entries_ + 1 > IndexLimit()) return ErrorCode::NO_AVAILABLE_HANDLE;
  auto a = alloc_->Allocate(need);
  if (!a) return a.error();
  uint64_t hash = KeyHash(key);
  ObjectHeaderFields f;
  f.key_hash = hash;
  f.generation = loc.generation;
  f.value_size = loc.value_len;
  f.extent_size = a->size;
  f.put_time_ns = now;
  f.flags = kFlagDiskStub;
  WriteObjectHeader(*pool_, a->offset, f, key);
  WriteStub(a->offset, key.size(), loc);
  auto slot = index_->Insert({hash, a->offset, loc.value_len, loc.generation, now, 0, kNoSlot});
  if (!slot) {
    (void)alloc_->Free(a->handle);
    return slot.error();
  }
  index_->BeginRewrite(*slot);
  index_->entry(*slot).state_gen.store(PackStateGen(loc.generation, EntryState::kOnDisk), std::memory_order_relaxed);
  index_->EndRewrite(*slot);
  entry_meta_[*slot] = EntryMeta{a->handle, uint32_t(key.size()), true, false, false};
  ++live_entries_;
  CountComplete(*slot);
  return *slot;
}

void MasterImpl::ReserveGeneration(uint64_t generation) {
  next_generation_ = std::max(next_generation_, generation + 1);
}

uint64_t MasterImpl::TombsDurable() const {
  return pool_->superblock()->tier_tombs_durable.load(std::memory_order_relaxed);
}

void MasterImpl::PublishTombsDurable(uint64_t seq) {
  Superblock* sb = pool_->superblock();
  // Release: a client that reads it (acquire) and returns orders its later
  // operations after the tombstone writes (which a SIGKILL does not undo).
  sb->tier_tombs_durable.store(seq, std::memory_order_release);
  PublishRange(&sb->tier_tombs_durable, sizeof(uint64_t));
}

}  // namespace mcxl
