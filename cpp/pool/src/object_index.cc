#include "mooncake_cxl/pool/object_index.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/publish.h"

namespace mcxl {
namespace {
constexpr int kSpinLimit = 20000;  // ~ms: longer than any master rewrite
constexpr int kLookupRetries = 64;

// How many of a[0..n) equal t: four tags per SSE2 step (each match adds -1).
uint64_t CountEqual(const uint32_t* a, uint64_t n, uint32_t t) {
  const __m128i key = _mm_set1_epi32(int32_t(t));
  __m128i matches = _mm_setzero_si128();
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4)
    matches = _mm_sub_epi32(matches, _mm_cmpeq_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)), key));
  uint32_t lanes[4];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes), matches);
  uint64_t count = uint64_t(lanes[0]) + lanes[1] + lanes[2] + lanes[3];
  for (; i < n; ++i) count += a[i] == t;
  return count;
}

uint64_t CountEqual(const uint64_t* a, uint64_t n, uint64_t h) {
  uint64_t count = 0;
  for (uint64_t i = 0; i < n; ++i) count += a[i] == h;
  return count;
}

// The shadow's 4-byte tag of a filed hash: its high half (the low bits pick
// the home slot, so they repeat within a window), always odd. Even tags say
// what a slot without a filed hash is.
uint32_t TagOf(uint64_t hash) { return uint32_t(hash >> 32) | 1; }
}  // namespace

ObjectIndex::ObjectIndex(const Pool* pool)
    : pool_(pool),
      entries_(pool->index()),
      capacity_(pool->geometry().index_capacity),
      sb_(pool->superblock()) {
  // Relaxed: the master's start value (Recover sets the real one).
  max_probe_ = std::min<uint64_t>(sb_->max_probe.load(std::memory_order_relaxed), capacity_ - 1);
}

bool ObjectIndex::ReadEntry(uint64_t slot, EntrySnapshot* out) const {
  IndexEntry& e = entries_[slot];
  for (int spin = 0; spin < kSpinLimit; ++spin) {
    ObserveRange(&e, sizeof(e));
    // Acquire: the field loads below see at least the writes that preceded
    // this (even) version's release store.
    uint64_t v1 = e.version.load(std::memory_order_acquire);
    if (v1 & 1) {
      _mm_pause();
      continue;
    }
    // Relaxed: consistency is established by the version re-check below.
    out->state_gen = e.state_gen.load(std::memory_order_relaxed);
    out->key_hash = e.key_hash.load(std::memory_order_relaxed);
    out->object_offset = e.object_offset.load(std::memory_order_relaxed);
    out->value_size = e.value_size.load(std::memory_order_relaxed);
    out->put_time_ns = e.put_time_ns.load(std::memory_order_relaxed);
    out->flags = e.flags.load(std::memory_order_relaxed);
    out->owner_slot = e.owner_slot.load(std::memory_order_relaxed);
    // Acquire fence: if any load above saw a write made after the writer's
    // odd store, the version load below sees that odd store (or later).
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.version.load(std::memory_order_relaxed) == v1) {
      out->slot = slot;
      out->version = v1;
      out->payload = nullptr;  // FindComplete checks and sets it
      return true;
    }
  }
  return false;
}

void ObjectIndex::PrefetchObject(uint64_t object_offset) const {
  // Unchecked: a prefetch never faults, and KeyMatches bounds-checks before
  // any load. Integer arithmetic: the offset may be garbage.
  uintptr_t at = reinterpret_cast<uintptr_t>(pool_->base()) + object_offset;
  for (uint64_t line = 0; line < kPrefetchObjectLines; ++line)
    __builtin_prefetch(reinterpret_cast<const void*>(at + line * 64));
}

bool ObjectIndex::StillValid(const EntrySnapshot& s) const {
  const IndexEntry& e = entries_[s.slot];
  // Acquire fence (ObserveRange): orders the caller's earlier reads of the
  // value before the version re-load (the seqlock reader's closing check);
  // on a non-coherent pool it also drops this host's copy of the line, so
  // the re-check sees the master's latest write-back.
  ObserveRange(&e, sizeof(e));
  if (e.version.load(std::memory_order_relaxed) != s.version) return false;
  // A client's CAS does not bump the version; make sure it is still COMPLETE.
  return e.state_gen.load(std::memory_order_relaxed) == s.state_gen;
}

bool ObjectIndex::KeyMatches(const EntrySnapshot& s, std::string_view key) const {
  return HeaderInBounds(*pool_, s.object_offset, key.size()) && KeyMatchesInBounds(s, key);
}

bool ObjectIndex::KeyMatchesInBounds(const EntrySnapshot& s, std::string_view key) const {
  const auto* h = pool_->At<const ObjectHeader>(s.object_offset);
  ObserveRange(h, sizeof(ObjectHeader) + key.size());
  // The header may be rewritten under us; every field is checked, and the
  // caller's StillValid decides whether the comparison counted.
  if (h->key_len != key.size() || h->key_hash != s.key_hash) return false;
  return memcmp(reinterpret_cast<const char*>(h + 1), key.data(), key.size()) == 0;
}

Result<EntrySnapshot> ObjectIndex::FindComplete(std::string_view key, uint64_t hash) const {
  for (int attempt = 0; attempt <= kLookupRetries; ++attempt) {
    // On the last attempt an entry that stays mid-rewrite is skipped rather
    // than failing every lookup that probes past it.
    bool last = attempt == kLookupRetries;
    // Acquire: pairs with the master's release when it raises max_probe, so
    // an entry inserted further away is reached (observed: a stale copy on
    // a non-coherent pool would be a false miss).
    ObserveRange(&sb_->max_probe, sizeof(uint64_t));
    uint64_t max_probe = sb_->max_probe.load(std::memory_order_acquire);  // clamped: shared word
    if (max_probe >= capacity_) max_probe = capacity_ - 1;
    bool found = false, retry = false;
    EntrySnapshot best, s;
    uint64_t home = HomeSlot(hash);
    for (uint64_t i = 0; i <= max_probe; ++i) {
      uint64_t slot = (home + i) & (capacity_ - 1);
      if (!ReadEntry(slot, &s)) {
        if (last) continue;
        retry = true;
        break;
      }
      if (s.state() == EntryState::kEmpty) break;
      if (!Readable(s.state()) || s.key_hash != hash) continue;
      PrefetchObject(s.object_offset);
      // One bounds check of the header serves the key compare and the payload
      // (a kOnDisk DiskStub, a kInSegment SegmentStub, else the value).
      if (!HeaderInBounds(*pool_, s.object_offset, key.size()) || !KeyMatchesInBounds(s, key)) continue;
      s.payload = PayloadInBounds(s, key.size());
      if (s.payload == nullptr) {
        // A consistent snapshot of an entry only the master writes cannot
        // point outside the data region: someone wrote into the pool.
        if (StillValid(s)) {
          corrupt_seen_.fetch_add(1, std::memory_order_relaxed);
          uint64_t now = MonoNs(), last = corrupt_last_log_ns_.load(std::memory_order_relaxed);
          if (now - last > 1000000000ull &&
              corrupt_last_log_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed))
            MCXL_LOG(kError, "index", "entry %llu of key '%.*s' is corrupt (value of %llu bytes at offset %llu "
                     "is outside the data region); skipped", (unsigned long long)slot, int(key.size()),
                     key.data(), (unsigned long long)s.value_size, (unsigned long long)s.object_offset);
        }
        continue;
      }
      if (!StillValid(s)) {
        retry = true;
        break;
      }
      if (!found || s.generation() > best.generation()) best = s;
      found = true;
      // Only an entry marked superseded can have a newer one further on.
      if (!(s.flags & kFlagSuperseded)) break;
    }
    // Past a superseded entry, the newer one may have gone while we probed
    // on; the master unlinks older values first, so if `best` is still
    // linked now, nothing newer was gone (a reader never returns an older
    // value than one that was current during its probe).
    if (!retry && found && (best.flags & kFlagSuperseded) && !StillValid(best)) retry = true;
    if (!retry) {
      if (found) return best;
      return ErrorCode::OBJECT_NOT_FOUND;
    }
    _mm_pause();
  }
  return ErrorCode::OBJECT_NOT_FOUND;
}

const char* ObjectIndex::PayloadInBounds(const EntrySnapshot& s, uint64_t key_len) const {
  // The header was checked first: ValueOffset cannot wrap once it is in bounds.
  uint64_t off = ValueOffset(s.object_offset, key_len);
  uint64_t len = s.state() == EntryState::kOnDisk      ? sizeof(DiskStub)
                 : s.state() == EntryState::kInSegment ? sizeof(SegmentStub)
                                                       : s.value_size;
  if (!pool_->InDataRegion(off, len)) return nullptr;
  return pool_->base() + off;
}

const char* ObjectIndex::ValuePtr(const EntrySnapshot& s, std::string_view key) const {
  if (s.state() == EntryState::kOnDisk || s.state() == EntryState::kInSegment) return nullptr;
  if (s.payload != nullptr) return s.payload;  // FindComplete checked this geometry
  if (!HeaderInBounds(*pool_, s.object_offset, key.size())) return nullptr;
  return PayloadInBounds(s, key.size());
}

const DiskStub* ObjectIndex::StubPtr(const EntrySnapshot& s, std::string_view key) const {
  if (s.state() != EntryState::kOnDisk) return nullptr;
  if (s.payload != nullptr) return reinterpret_cast<const DiskStub*>(s.payload);
  if (!HeaderInBounds(*pool_, s.object_offset, key.size())) return nullptr;
  return reinterpret_cast<const DiskStub*>(PayloadInBounds(s, key.size()));
}

const SegmentStub* ObjectIndex::SegmentStubPtr(const EntrySnapshot& s, std::string_view key) const {
  if (s.state() != EntryState::kInSegment) return nullptr;
  if (s.payload != nullptr) return reinterpret_cast<const SegmentStub*>(s.payload);
  if (!HeaderInBounds(*pool_, s.object_offset, key.size())) return nullptr;
  return reinterpret_cast<const SegmentStub*>(PayloadInBounds(s, key.size()));
}

void ObjectIndex::ExtendLease(uint64_t slot, uint64_t until_ns) const {
  IndexEntry& e = entries_[slot];
  // Relaxed: the lease word publishes no data; it is compared with the clock.
  uint64_t cur = e.lease_until_ns.load(std::memory_order_relaxed);
  // Skip the write (a shared cache line) unless it extends the lease by >1 ms.
  bool wrote = false;
  while (until_ns > cur + 1000000 &&
         !(wrote = e.lease_until_ns.compare_exchange_weak(cur, until_ns, std::memory_order_relaxed))) {
  }
  if (wrote) PublishRange(&e.lease_until_ns, sizeof(uint64_t));
}

void ObjectIndex::LowerLease(uint64_t slot, uint64_t to_ns) const {
  IndexEntry& e = entries_[slot];
  // Relaxed: as ExtendLease. A reader raising it meanwhile makes the CAS fail
  // and the loop re-decide with its value.
  uint64_t cur = e.lease_until_ns.load(std::memory_order_relaxed);
  bool wrote = false;
  while (cur > to_ns && !(wrote = e.lease_until_ns.compare_exchange_weak(cur, to_ns, std::memory_order_relaxed))) {
  }
  if (wrote) PublishRange(&e.lease_until_ns, sizeof(uint64_t));
}

bool ObjectIndex::LowerLeaseOf(const EntrySnapshot& s, uint64_t to_ns) const {
  if (!StillValid(s)) return false;
  IndexEntry& e = entries_[s.slot];
  uint64_t cur = e.lease_until_ns.load(std::memory_order_relaxed);  // relaxed: as LowerLease
  bool wrote = false;
  while (cur > to_ns && !(wrote = e.lease_until_ns.compare_exchange_weak(cur, to_ns, std::memory_order_relaxed))) {
  }
  if (!wrote) return true;
  PublishRange(&e.lease_until_ns, sizeof(uint64_t));
  // seq_cst: our lease write is ordered before the version re-load, so a
  // rewrite (tombstone, reinsert) that came first is seen here.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (StillValid(s)) return true;
  // The slot was reused between the checks: give the new object its lease
  // back (only if nobody wrote the word since; a reader's raise wins).
  uint64_t mine = to_ns;
  if (e.lease_until_ns.compare_exchange_strong(mine, cur, std::memory_order_relaxed))
    PublishRange(&e.lease_until_ns, sizeof(uint64_t));
  return false;
}

void ObjectIndex::PrefetchEntry(uint64_t slot) const {
  if (slot >= capacity_) return;
  __builtin_prefetch(&entries_[slot]);
  if (shadowed_) __builtin_prefetch(&shadow_hash_[slot]);
}

void ObjectIndex::PrefetchBehindEntry(uint64_t slot) const {
  if (slot >= capacity_) return;
  // Relaxed: a hint; the offset is bounded before it becomes an address.
  uint64_t off = entries_[slot].object_offset.load(std::memory_order_relaxed);
  if (off < pool_->size()) __builtin_prefetch(pool_->base() + off);
  if (!shadowed_) return;
  // Tombstone's walk back and ShadowCount read the tags from the home on.
  uint64_t home = HomeSlot(shadow_hash_[slot]);
  __builtin_prefetch(&shadow_tag_[home]);
  __builtin_prefetch(&shadow_tag_[(home + 16) & (capacity_ - 1)]);
  __builtin_prefetch(&shadow_tag_[(home + 32) & (capacity_ - 1)]);
  __builtin_prefetch(&shadow_tag_[(home + 48) & (capacity_ - 1)]);
}

uint64_t ObjectIndex::LeaseUntil(uint64_t slot) const {
  // Relaxed: a hint compared with the clock, as above.
  return entries_[slot].lease_until_ns.load(std::memory_order_relaxed);
}

bool ObjectIndex::CasState(uint64_t slot, uint64_t expected, uint64_t desired) const {
  IndexEntry& e = entries_[slot];
  // acq_rel: release publishes the value bytes written before a COMPLETE
  // (PublishRange already fenced them); acquire lets the master, winning an
  // abort, see the state the client left.
  bool ok = e.state_gen.compare_exchange_strong(expected, desired, std::memory_order_acq_rel);
  PublishRange(&e, sizeof(e));
  return ok;
}

bool ObjectIndex::PublishComplete(uint64_t slot, uint64_t generation, EntryState as) const {
  return CasState(slot, PackStateGen(generation, EntryState::kWriting), PackStateGen(generation, as));
}

bool ObjectIndex::Abort(uint64_t slot, uint64_t generation) const {
  return CasState(slot, PackStateGen(generation, EntryState::kWriting),
                  PackStateGen(generation, EntryState::kAborted));
}

void ObjectIndex::BeginWrite(IndexEntry& e) {
  // Relaxed load: only this thread writes the version.
  uint64_t v = e.version.load(std::memory_order_relaxed);
  e.version.store(v | 1, std::memory_order_relaxed);
  // Release fence: the odd version is ordered before every field store that
  // follows, so a reader that sees one of them also sees the odd version.
  std::atomic_thread_fence(std::memory_order_release);
}

void ObjectIndex::EndWrite(IndexEntry& e) {
  uint64_t v = e.version.load(std::memory_order_relaxed);
  PublishRange(&e, sizeof(e));
  // Release: the field stores are visible before the even version.
  e.version.store((v | 1) + 1, std::memory_order_release);
  PublishRange(&e, sizeof(e));
}

Result<uint64_t> ObjectIndex::Insert(const InsertArgs& a) {
  uint64_t home = HomeSlot(a.key_hash);
  for (uint64_t i = 0; i < std::min(capacity_, kMaxProbeSlots); ++i) {
    uint64_t slot = (home + i) & (capacity_ - 1);
    // The shadow's live slots are skipped without touching their pool line;
    // a free one is still checked in the pool (someone may have written it).
    if (shadowed() && UseOf(slot) == SlotUse::kLive) continue;
    IndexEntry& e = entries_[slot];
    EntryState st = StateOf(e.state_gen.load(std::memory_order_relaxed));
    if (st != EntryState::kEmpty && st != EntryState::kTombstone) continue;
    BeginWrite(e);
    e.key_hash.store(a.key_hash, std::memory_order_relaxed);
    e.object_offset.store(a.object_offset, std::memory_order_relaxed);
    e.value_size.store(a.value_size, std::memory_order_relaxed);
    e.lease_until_ns.store(0, std::memory_order_relaxed);
    e.flags.store(a.flags, std::memory_order_relaxed);
    e.owner_slot.store(a.owner_slot, std::memory_order_relaxed);
    e.put_time_ns.store(a.put_time_ns, std::memory_order_relaxed);
    e.state_gen.store(PackStateGen(a.generation, EntryState::kWriting), std::memory_order_relaxed);
    EndWrite(e);
    if (shadowed()) ShadowAdd(slot, a.key_hash);
    if (i > max_probe_) {
      max_probe_ = i;
      // Release: readers that load the larger bound also see the entry.
      sb_->max_probe.store(i, std::memory_order_release);
      PublishRange(&sb_->max_probe, sizeof(uint64_t));
    }
    return slot;
  }
  return ErrorCode::NO_AVAILABLE_HANDLE;
}

ObjectIndex::SlotUse ObjectIndex::PoolUseOf(uint64_t slot) const {
  // Master-side loads are relaxed: only the master changes states and hashes
  // legitimately, under its lock. A state or key hash another process
  // rewrote can only cost an entry its reachability: a miss, never a wrong
  // value.
  EntryState st = StateOf(entries_[slot].state_gen.load(std::memory_order_relaxed));
  return st == EntryState::kEmpty ? SlotUse::kEmpty : st == EntryState::kTombstone ? SlotUse::kTombstone : SlotUse::kLive;
}

bool ObjectIndex::NoProbePasses(uint64_t t) const {
  for (uint64_t k = 1; k <= max_probe_; ++k) {
    uint64_t j = (t + k) & (capacity_ - 1);
    SlotUse use = UseOf(j);
    if (use == SlotUse::kEmpty) return true;
    if (use == SlotUse::kTombstone) continue;
    if (Distance(j, HashOf(j)) >= k) return false;
  }
  return true;
}

void ObjectIndex::MakeEmpty(uint64_t slot) {
  IndexEntry& e = entries_[slot];
  // Relaxed: a tombstone's state is the master's alone (no client CASes it).
  uint64_t sg = e.state_gen.load(std::memory_order_relaxed);
  BeginWrite(e);
  e.state_gen.store(PackStateGen(GenOf(sg), EntryState::kEmpty), std::memory_order_relaxed);
  EndWrite(e);
  if (shadowed()) shadow_tag_[slot] = kTagEmpty;
}

void ObjectIndex::Tombstone(uint64_t slot) {
  IndexEntry& e = entries_[slot];
  uint64_t gen = GenOf(e.state_gen.load(std::memory_order_relaxed));
  // Tombstones between the entry's home and it may have stayed for its sake.
  uint64_t back = std::min(Distance(slot, HashOf(slot)), max_probe_);
  BeginWrite(e);
  e.state_gen.store(PackStateGen(gen, EntryState::kTombstone), std::memory_order_relaxed);
  e.flags.store(0, std::memory_order_relaxed);
  EndWrite(e);
  if (shadowed()) ShadowRemove(slot);
  // An EMPTY where a tombstone was ends only probes that no live entry lies
  // beyond (NoProbePasses), so sequences keep no EMPTY gap; readers that
  // stop there miss only keys that are not there. Walks back over the
  // entry's own stretch, then over the run of tombstones that ends in an
  // EMPTY (which no probe passes through any more). With the shadow the walk
  // reads DRAM tags, not one pool line a slot.
  for (uint64_t i = 0; i < capacity_; ++i) {
    uint64_t t = (slot - i) & (capacity_ - 1);
    bool mine = i <= back;
    if (UseOf(t) != SlotUse::kTombstone) {
      if (mine) continue;
      break;
    }
    bool next_empty = UseOf((t + 1) & (capacity_ - 1)) == SlotUse::kEmpty;
    if (!mine && !next_empty) break;
    if (next_empty || NoProbePasses(t)) MakeEmpty(t);
  }
}

void ObjectIndex::SetFlags(uint64_t slot, uint32_t flags) {
  IndexEntry& e = entries_[slot];
  BeginWrite(e);
  e.flags.store(flags, std::memory_order_relaxed);
  EndWrite(e);
}

void ObjectIndex::SetMaxProbe(uint64_t v) {
  max_probe_ = std::min(v, capacity_ - 1);
  // Release: as in Insert.
  sb_->max_probe.store(max_probe_, std::memory_order_release);
  PublishRange(&sb_->max_probe, sizeof(uint64_t));
}

bool ObjectIndex::RestoreMaxProbe() {
  ObserveRange(&sb_->max_probe, sizeof(uint64_t));
  // Relaxed: only the master writes it legitimately; compared with our copy.
  if (sb_->max_probe.load(std::memory_order_relaxed) == max_probe_) return false;
  SetMaxProbe(max_probe_);
  return true;
}

void ObjectIndex::EnableShadow() {
  shadow_hash_.assign(capacity_, 0);
  shadow_tag_.assign(capacity_, 0);
  for (uint64_t slot = 0; slot < capacity_; ++slot) {
    // Relaxed: the master's start-up scan; it alone changes states from now on.
    EntryState st = StateOf(entries_[slot].state_gen.load(std::memory_order_relaxed));
    if (st == EntryState::kTombstone)
      shadow_tag_[slot] = kTagTombstone;
    else if (st != EntryState::kEmpty)
      ShadowAdd(slot, entries_[slot].key_hash.load(std::memory_order_relaxed));
  }
  shadowed_ = true;
}

void ObjectIndex::ShadowAdd(uint64_t slot, uint64_t hash) {
  // One hash a slot: a slot still filed (someone else turned a live entry
  // into a free one and the master reused it) is simply refiled. A stored
  // hash of 0 (never a KeyHash) files under no hash.
  shadow_hash_[slot] = hash;
  shadow_tag_[slot] = hash == kUnfiled ? kTagLiveUnfiled : TagOf(hash);
}

void ObjectIndex::ShadowRemove(uint64_t slot) {
  shadow_hash_[slot] = kUnfiled;
  shadow_tag_[slot] = kTagTombstone;
}

uint64_t ObjectIndex::ShadowCount(uint64_t hash, bool exact) const {
  // Insert files a slot only within kMaxProbeSlots of its home (and within
  // the master's max_probe), so the slots of a hash lie in that window: one
  // DRAM stretch (two where it wraps), counted without branches, tags
  // first (64 of them are 256 bytes), whole hashes only where one matched.
  uint64_t home = HomeSlot(hash), n = ShadowWindow();
  uint64_t first = std::min(n, capacity_ - home);
  uint32_t tag = TagOf(hash);
  const uint32_t* t = shadow_tag_.data();
  uint64_t tagged = CountEqual(t + home, first, tag) + CountEqual(t, n - first, tag);
  if (!exact || tagged == 0) return tagged;
  const uint64_t* a = shadow_hash_.data();
  return CountEqual(a + home, first, hash) + CountEqual(a, n - first, hash);
}

void ObjectIndex::ShadowSlots(uint64_t hash, std::vector<uint64_t>* out) const {
  out->clear();
  if (hash == kUnfiled) return;
  uint64_t want = ShadowCount(hash, true);
  uint64_t home = HomeSlot(hash);
  for (uint64_t i = 0; out->size() < want; ++i) {  // in probe order
    uint64_t slot = (home + i) & (capacity_ - 1);
    if (shadow_hash_[slot] == hash) out->push_back(slot);
  }
}

bool ObjectIndex::ShadowAlone(uint64_t slot) const {
  uint64_t hash = shadow_hash_[slot];
  if (hash == kUnfiled || Distance(slot, hash) >= ShadowWindow()) return false;
  // The slot's own tag is in the window: a count of one is the slot alone.
  return ShadowCount(hash, false) == 1 || ShadowCount(hash, true) == 1;
}

uint64_t ObjectIndex::MissProbeLength(uint64_t hash) const {
  uint64_t home = HomeSlot(hash);
  for (uint64_t i = 0; i <= max_probe_; ++i)
    if (UseOf((home + i) & (capacity_ - 1)) == SlotUse::kEmpty) return i + 1;
  return max_probe_ + 1;
}

void ObjectIndex::RepairVersion(uint64_t slot) {
  IndexEntry& e = entries_[slot];
  uint64_t v = e.version.load(std::memory_order_relaxed);
  if (v & 1) e.version.store(v + 1, std::memory_order_release);
}

}  // namespace mcxl
