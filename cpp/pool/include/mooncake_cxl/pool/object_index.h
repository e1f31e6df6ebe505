// ObjectIndex: the open-addressed hash table of objects that lives in the pool.
//
// Contract: 64-byte entries, linear probing from KeyHash(key) & (capacity-1).
// EMPTY ends a probe sequence, TOMBSTONE does not; no probe goes further than
// Superblock::max_probe, and Insert places no entry kMaxProbeSlots or more
// slots from its home, so every lookup reads at most kMaxProbeSlots entries
// however full the table is (the master evicts in the window when it is
// full). Tombstone turns every tombstone no probe needs any more back into
// EMPTY, so misses stop early where they can. Two sides use it:
//   * Readers (every client, one-sided, no master round trip): ReadEntry takes
//     a consistent snapshot of an entry under its seqlock; FindComplete finds
//     the newest COMPLETE entry of a key; a caller that copies the value
//     re-checks StillValid afterwards and retries when it fails.
//   * The master (the only structural writer): Insert, Tombstone, SetFlags,
//     all of which bump the entry's version to odd before and to even after.
//     Its own lookups use a DRAM shadow (EnableShadow): per slot, the key
//     hash it inserted there and has not tombstoned since, kept exact by
//     Insert and Tombstone, so they never read the pool's tombstones (the
//     tombstone walk and Insert's skip read its tags, not pool lines); what
//     the shadow names is still checked against the pool entry.
// The putting client's only write is PublishComplete/Abort: a CAS of
// state_gen that names the generation it was given, so it cannot touch an
// entry the master has since revoked or reused.
//
// Any client can write any entry, so a reader dereferences nothing an entry
// says before a bounds check: the header (with the length of the key it
// looks for, never the header's) and the value must lie in the data region.
// An entry whose value does not is corrupt: skipped (a miss), counted in
// corrupt_seen(), logged (rate-limited). The probe bound, max_probe, is a
// shared word: readers clamp it to the capacity; the master keeps its own
// copy and restores the shared one if someone else changed it.
//
// Thread safety: reader methods are safe from any thread of any process.
// Master methods REQUIRE the master's single thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string_view>
#include <vector>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/pool/layout.h"
#include "mooncake_cxl/pool/pool.h"

namespace mcxl {

struct EntrySnapshot {
  uint64_t slot = 0;
  uint64_t version = 0;
  uint64_t state_gen = 0;
  uint64_t key_hash = 0;
  uint64_t object_offset = 0;
  uint64_t value_size = 0;
  uint64_t put_time_ns = 0;
  uint32_t flags = 0;
  uint32_t owner_slot = 0;
  // Set by FindComplete: where the value (kOnDisk: its DiskStub; kInSegment:
  // its SegmentStub) starts in this process's mapping, bounds-checked once
  // for the snapshot's geometry; nullptr in a snapshot taken otherwise
  // (ValuePtr / StubPtr / SegmentStubPtr compute it).
  const char* payload = nullptr;
  EntryState state() const { return StateOf(state_gen); }
  uint64_t generation() const { return GenOf(state_gen); }
};

class ObjectIndex {
 public:
  // Longest probe sequence Insert builds (slots read by the longest lookup).
  // 64 entries are one 4 KiB stretch of the pool: a miss in a full table
  // costs a few sequential lines more than in an empty one.
  static constexpr uint64_t kMaxProbeSlots = 64;

  explicit ObjectIndex(const Pool* pool);

  uint64_t capacity() const { return capacity_; }
  uint64_t HomeSlot(uint64_t hash) const { return hash & (capacity_ - 1); }
  // Slots from the home of the key hash `hash` to `slot` (0: at its home).
  uint64_t Distance(uint64_t slot, uint64_t hash) const { return (slot - hash) & (capacity_ - 1); }

  // ---- reader side ----
  // Consistent copy of entry `slot`; false when it stayed mid-rewrite for the
  // whole bounded spin (a master that died mid-write: recovery fixes it).
  bool ReadEntry(uint64_t slot, EntrySnapshot* out) const;
  // True while the entry has not been rewritten since `s` was taken.
  bool StillValid(const EntrySnapshot& s) const;
  // True when the object header of `s` names `key` (bounds-checked: a
  // snapshot of a reused extent yields false or fails StillValid, never a
  // read outside the pool).
  bool KeyMatches(const EntrySnapshot& s, std::string_view key) const;
  // The newest readable (COMPLETE, kOnDisk: value in the SSD tier, or
  // kInSegment: value in a DRAM segment) entry of `key`: OBJECT_NOT_FOUND
  // when none.
  Result<EntrySnapshot> FindComplete(std::string_view key, uint64_t hash) const;
  // Where the value of `s` starts in this process's mapping, or nullptr when
  // the snapshot's geometry is not inside the data region or the value is
  // not in the pool (kOnDisk, kInSegment).
  const char* ValuePtr(const EntrySnapshot& s, std::string_view key) const;
  // The DiskStub of a kOnDisk snapshot (at its value offset), or nullptr
  // when the stub is not inside the data region. Copy it, then StillValid.
  const DiskStub* StubPtr(const EntrySnapshot& s, std::string_view key) const;
  // The SegmentStub of a kInSegment snapshot, likewise.
  const SegmentStub* SegmentStubPtr(const EntrySnapshot& s, std::string_view key) const;
  // Entries FindComplete skipped as corrupt (value outside the data region).
  uint64_t corrupt_seen() const { return corrupt_seen_.load(std::memory_order_relaxed); }
  uint64_t ValueOffset(uint64_t object_offset, uint64_t key_len) const {
    return object_offset + ObjectHeaderBytes(key_len);
  }
  // Eviction's look-ahead (master side; hints only, nothing is read that a
  // fault could follow): the entry's line and its shadow hash, then, once
  // those are in cache, the shadow tags of its window and the object header
  // the entry names (when inside the pool).
  void PrefetchEntry(uint64_t slot) const;
  void PrefetchBehindEntry(uint64_t slot) const;
  // Raises the entry's lease to `until_ns` (never lowers it).
  void ExtendLease(uint64_t slot, uint64_t until_ns) const;
  uint64_t LeaseUntil(uint64_t slot) const;
  // Lowers the entry's lease to `to_ns` when it reaches past it (a released hold).
  void LowerLease(uint64_t slot, uint64_t to_ns) const;
  // LowerLease for the object of snapshot `s` only: false (and the lease word
  // left as it was) when the slot no longer holds that object, checked before
  // the write and again after it (a slot reused in between gets its lease
  // back, unless a reader raised it meanwhile: then the reader's value stays).
  bool LowerLeaseOf(const EntrySnapshot& s, uint64_t to_ns) const;

  // ---- putting client ----
  // CAS WRITING->COMPLETE (resp. ABORTED) for the generation the master gave.
  // `as` kInSegment for a put the master placed in the putter's DRAM segment.
  bool PublishComplete(uint64_t slot, uint64_t generation, EntryState as = EntryState::kComplete) const;
  bool Abort(uint64_t slot, uint64_t generation) const;

  // ---- master side ----
  struct InsertArgs {
    uint64_t key_hash, object_offset, value_size, generation, put_time_ns;
    uint32_t flags, owner_slot;
  };
  // Places a WRITING entry in the first free slot of the key's first
  // kMaxProbeSlots: the slot, or NO_AVAILABLE_HANDLE when they are all live.
  Result<uint64_t> Insert(const InsertArgs& args);
  // Unlinks the entry: TOMBSTONE, then every tombstone from the entry's home
  // to it (and the run of tombstones before an EMPTY) that no live entry's
  // probe passes through becomes EMPTY.
  void Tombstone(uint64_t slot);
  void SetFlags(uint64_t slot, uint32_t flags);
  // A rewrite of several fields of a live entry (the SSD tier moves an
  // object between tiers in place): odd version, the master's stores, even.
  void BeginRewrite(uint64_t slot) { BeginWrite(entries_[slot]); }
  void EndRewrite(uint64_t slot) { EndWrite(entries_[slot]); }
  // Repairs an entry left odd by a master that died mid-write.
  void RepairVersion(uint64_t slot);
  // The master's own probe bound (recovery sets it from the entries it
  // kept); RestoreMaxProbe republishes it when the shared word differs and
  // says whether it had to.
  void SetMaxProbe(uint64_t v);
  bool RestoreMaxProbe();
  // Builds the shadow from every entry that is neither EMPTY nor TOMBSTONE
  // (under the key hash it holds now); from then on Insert and Tombstone
  // keep it. Flat DRAM arrays, 12 bytes a slot (the hash filed there, 0 for
  // none, and a 4-byte tag of it or of the slot's EMPTY/TOMBSTONE state):
  // filing and unfiling are two stores, no allocation.
  void EnableShadow();
  bool shadowed() const { return shadowed_; }
  // The shadow's slots of key hash `hash` within max_probe of its home, in
  // probe order (REQUIRES shadowed()): every entry a reader's probe can
  // reach. A superset of the master's live entries of the hash there: the
  // caller checks state, hash and key in the pool entry.
  void ShadowSlots(uint64_t hash, std::vector<uint64_t>* out) const;
  // `slot` is filed and no other slot under its hash (REQUIRES shadowed()):
  // the master has no other entry of its key.
  bool ShadowAlone(uint64_t slot) const;
  uint64_t ShadowHash(uint64_t slot) const { return shadow_hash_[slot]; }  // 0: not filed
  // Slots a reader's lookup of an absent key of hash `hash` reads now (to
  // the first EMPTY, at most max_probe + 1): the probe-length statistic.
  uint64_t MissProbeLength(uint64_t hash) const;
  uint64_t max_probe() const { return max_probe_; }
  IndexEntry& entry(uint64_t slot) const { return entries_[slot]; }
  const Pool* pool() const { return pool_; }

 private:
  // Lines loaded ahead from an object's start once its entry matches the
  // hash (header, key, the value's first bytes): the key compare and the
  // copy that follows then wait on one miss instead of two in a row.
  static constexpr uint64_t kPrefetchObjectLines = 4;
  void PrefetchObject(uint64_t object_offset) const;
  // KeyMatches after the header's bounds were checked.
  bool KeyMatchesInBounds(const EntrySnapshot& s, std::string_view key) const;
  // The value's (kOnDisk: the stub's) address after the header's bounds
  // were checked; nullptr when it does not lie inside the data region.
  const char* PayloadInBounds(const EntrySnapshot& s, uint64_t key_len) const;
  void BeginWrite(IndexEntry& e);
  void EndWrite(IndexEntry& e);
  bool CasState(uint64_t slot, uint64_t expected, uint64_t desired) const;
  // A slot's use and key hash for the master's own walks: from the shadow
  // when it is on (DRAM, exact for the master's writes), else the pool.
  enum class SlotUse { kEmpty, kTombstone, kLive };
  SlotUse UseOf(uint64_t slot) const {
    if (shadowed_) {
      uint32_t tag = shadow_tag_[slot];
      return tag == kTagEmpty ? SlotUse::kEmpty : tag == kTagTombstone ? SlotUse::kTombstone : SlotUse::kLive;
    }
    return PoolUseOf(slot);
  }
  SlotUse PoolUseOf(uint64_t slot) const;
  uint64_t HashOf(uint64_t slot) const {
    // Relaxed: as in PoolUseOf.
    return shadowed_ ? shadow_hash_[slot] : entries_[slot].key_hash.load(std::memory_order_relaxed);
  }
  // True when no live entry within max_probe after tombstone `t` has its
  // home at or before `t` (its probe would pass t): t may become EMPTY.
  bool NoProbePasses(uint64_t t) const;
  void MakeEmpty(uint64_t slot);
  void ShadowAdd(uint64_t slot, uint64_t hash);
  void ShadowRemove(uint64_t slot);
  // Slots filed under `hash` in its window (`exact`), or those whose tag
  // matches (a superset).
  uint64_t ShadowCount(uint64_t hash, bool exact) const;
  uint64_t ShadowWindow() const { return std::min({capacity_, max_probe_ + 1, kMaxProbeSlots}); }

  const Pool* pool_;
  IndexEntry* entries_;
  uint64_t capacity_;
  Superblock* sb_;
  uint64_t max_probe_ = 0;  // master side only
  // The shadow (master side only): slot -> the hash filed there, kUnfiled
  // for none (KeyHash is never 0).
  static constexpr uint64_t kUnfiled = 0;
  // Even tags say what a slot without a filed hash is (TagOf is odd).
  static constexpr uint32_t kTagEmpty = 0;
  static constexpr uint32_t kTagTombstone = 2;
  static constexpr uint32_t kTagLiveUnfiled = 4;  // a live entry under hash 0 (never a KeyHash)
  std::vector<uint64_t> shadow_hash_;
  // A 4-byte tag a slot, what lookups and the tombstone walk scan: odd, the
  // filed hash's; even, EMPTY, TOMBSTONE, or live under no hash.
  std::vector<uint32_t> shadow_tag_;
  bool shadowed_ = false;
  // Relaxed: a statistic.
  mutable std::atomic<uint64_t> corrupt_seen_{0};
  mutable std::atomic<uint64_t> corrupt_last_log_ns_{0};
};

}  // namespace mcxl
