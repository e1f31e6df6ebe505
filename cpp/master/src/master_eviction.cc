// Eviction: approximate LRU by sampling, after Redis's evict.c.
//
// When a put would lift the pool above --eviction_high_watermark_ratio, or
// an allocation fails (fragmentation), the master runs an eviction round that
// frees about --eviction_ratio of the capacity (more if the put needs more).
// The index is a capacity too: past --index_high_watermark_ratio of its
// entries in use, a put's round frees index slots (at most
// kInlineIndexEntries; the ahead slices bring it down to the watermark
// minus --eviction_ratio), and a key whose probe window is full gets a slot
// there (EvictInWindow). Which objects? The least recently used ones that
// nothing protects; when slots are wanted, disk-resident (kOnDisk) ones are
// among them, and one that goes takes its SSD record along
// (EvictCandidate), so an index full of stubs still takes new puts.
//
// Recency. Reads never reach the master (they are one-sided), so there is no
// global LRU list to maintain and none is wanted: a list touched by every
// read would turn each get into a shared write. Instead every read raises its
// entry's lease word to now + ttl, so the last access of an object is
// lease_until - ttl, or its put time when it was never read. That costs the
// reader one relaxed CAS it already does for the lease.
//
// Sampling. A round does not sort the whole index. Like Redis, it looks at a
// sample and evicts the oldest of it: a window of up to kSampleSize COMPLETE
// entries from a random point of the index (hash order is random order), its
// evictable members sorted by last access, evicted oldest first until the
// target is met, then the next window if needed. With fewer live objects than
// a window the order is exact LRU; with more it is the classic approximation,
// at a cost per round bounded by the window, not by the pool.
//
// Protection. Never evicted: objects with a live lease (a reader just used
// them: Mooncake's rule), hard-pinned objects, unfinished puts, objects a
// BufferHandle views (pinned in some client's pin table). Soft-pinned objects
// go only in a second pass, when the first found too little and
// --allow_evict_soft_pinned_objects is on. Objects put with the same group id
// (K and V, TP shards) are evicted together or not at all.
//
// Upserts. Until Tick settles an upsert, its key has two COMPLETE entries;
// the newest is the value (readers take it). Evicting an entry therefore
// takes every older entry of its key along, oldest first, and an entry with
// an older upsert still WRITING is not evicted yet: eviction may drop a key,
// never bring an older value back.
//
// Readers copying an object while it is evicted are safe by the seqlock
// (docs/architecture.md §3): the tombstone bumps the entry version before the extent is
// freed, so their re-check fails and they retry (and miss).
//
// Atomics follow the three rules stated in master_impl.h.
#include <algorithm>
#include <cstdint>
#include <span>
#include <unordered_set>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "master_impl.h"

namespace mcxl {
namespace {
constexpr uint64_t kSampleSize = 4096;
// Index slots one inline round frees at most: the oldest quarter of a
// sample, so a put over the index's watermark pays for one sample, not for
// a whole --eviction_ratio (tens of thousands of objects on a large pool).
constexpr uint64_t kInlineIndexEntries = kSampleSize / 4;

}  // namespace

// Every object generation some live or retired pin table names, gathered
// once per round (generations are unique over the pool's life).
struct MasterImpl::PinSet {
  std::unordered_set<uint64_t> gens;
  bool Has(uint64_t gen) const { return gens.count(gen) != 0; }
};

uint64_t MasterImpl::LastAccessNs(uint64_t slot, uint64_t ttl_ns) const {
  const IndexEntry& e = index_->entry(slot);
  uint64_t put = e.put_time_ns.load(std::memory_order_relaxed);
  uint64_t lease = index_->LeaseUntil(slot);
  return lease > ttl_ns && lease - ttl_ns > put ? lease - ttl_ns : put;
}

bool MasterImpl::SoftPinActive(uint64_t slot, uint64_t now) const {
  // The entry's flag first: the header (a cache miss per object in a
  // sampling scan) is read only for soft-pinned objects.
  if (!(index_->entry(slot).flags.load(std::memory_order_relaxed) & kFlagSoftPin)) return false;
  // Values only (a client that rewrote them changes a decision, not a bound).
  const ObjectHeader* h = HeaderOf(slot);
  return h != nullptr && h->soft_pin_ttl_ms != 0 && h->put_time_ns + h->soft_pin_ttl_ms * 1000000ull > now;
}

MasterImpl::Protection MasterImpl::Protected(uint64_t slot, uint64_t now, const PinSet& pins) const {
  const IndexEntry& e = index_->entry(slot);
  uint64_t sg = e.state_gen.load(std::memory_order_acquire);
  EntryState st = StateOf(sg);
  if (st != EntryState::kComplete && st != EntryState::kOnDisk) return Protection::kTransient;  // unfinished or gone
  if (e.flags.load(std::memory_order_relaxed) & kFlagHardPin) return Protection::kPermanent;
  if (index_->LeaseUntil(slot) > now || pins.Has(GenOf(sg))) return Protection::kTransient;
  return Protection::kNone;
}

void MasterImpl::AddToGroup(uint64_t slot, uint64_t g) {
  if (g == 0) return;
  groups_[g].push_back(slot);
  group_of_[slot] = g;
}

void MasterImpl::RemoveFromGroup(uint64_t slot) {
  auto gi = group_of_.find(slot);
  if (gi == group_of_.end()) return;
  uint64_t g = gi->second;
  group_of_.erase(gi);
  auto it = groups_.find(g);
  if (it == groups_.end()) return;
  auto& v = it->second;
  v.erase(std::remove(v.begin(), v.end(), slot), v.end());
  if (v.empty()) groups_.erase(it);
}

uint64_t MasterImpl::EvictOrDemote(uint64_t slot, uint64_t* bytes) {
  if (!tier_ || evict_drop_) return UnlinkWithOlder(slot, bytes);
  bool waits = false;
  uint64_t n = tier_->EvictOrDemote(slot, bytes, &waits);
  if (waits) round_blocked_transiently_ = true;
  return n;
}

void MasterImpl::DropGroup(uint64_t slot) {
  std::vector<uint64_t> members = GroupMembers(slot);
  if (members.size() < 2) return;
  uint64_t n = 0;
  for (uint64_t m : members)
    if (entry_meta_[m].live && Readable(StateOf(index_->entry(m).state_gen.load(std::memory_order_acquire))))
      n += UnlinkWithOlder(m, nullptr);
  stats_.evicted_keys += n;
}

uint64_t MasterImpl::RandomSlot() {
  // xorshift64: where a sampled scan of the index starts (EvictRound,
  // EvictAhead, DemoteAhead); the index capacity is a power of two.
  eviction_rng_ ^= eviction_rng_ << 13;
  eviction_rng_ ^= eviction_rng_ >> 7;
  eviction_rng_ ^= eviction_rng_ << 17;
  return eviction_rng_ & (index_->capacity() - 1);
}

uint64_t MasterImpl::SampleSlot(uint64_t start, uint64_t i) const {
  // Runs of 8 slots (one 512-byte stretch, read sequentially) visited in an
  // order that spreads over the whole index: an odd stride visits every run
  // once per pass (the run count is a power of two). A contiguous sample
  // would evict one region bare and leave the rest of the table as full,
  // so probe windows there fill up.
  constexpr uint64_t kRun = 8, kStride = 0x9E3779B97F4A7C15ull;  // odd
  uint64_t cap = index_->capacity(), runs = cap / kRun;
  uint64_t run = (start / kRun + (i / kRun) * kStride) & (runs - 1);
  return run * kRun + i % kRun;
}

std::vector<uint64_t> MasterImpl::GroupMembers(uint64_t slot) const {
  auto gi = group_of_.find(slot);
  if (gi != group_of_.end()) {
    auto it = groups_.find(gi->second);
    if (it != groups_.end()) return it->second;
  }
  return {slot};
}

bool MasterImpl::MemberHeld(uint64_t m, uint64_t now, const PinSet& pins, bool check_older) {
  Protection p = Protected(m, now, pins);
  // An older upsert of the key still being written would become the key's
  // value once this one is gone: wait for it (transient).
  if (p == Protection::kNone && check_older && OlderUnfinished(m)) p = Protection::kTransient;
  if (p == Protection::kTransient) round_blocked_transiently_ = true;
  return p != Protection::kNone;
}

uint64_t MasterImpl::EvictWithGroup(uint64_t slot, uint64_t now, const PinSet& pins, uint64_t* bytes) {
  // Most objects have no group: no member list to allocate for them.
  uint64_t single[1] = {slot};
  std::vector<uint64_t> grouped;
  std::span<const uint64_t> members(single);
  if (group_of_.count(slot) != 0) members = grouped = GroupMembers(slot);
  // The common case: no other entry of its key, so no older upsert to wait
  // for or take along (one shadow count instead of a key lookup, twice).
  const bool alone = members.size() == 1 && AloneUnderItsHash(slot);
  for (uint64_t m : members) {
    // Already in the SSD tier: its bytes left the pool; the rest follow.
    if (entry_meta_[m].live &&
        StateOf(index_->entry(m).state_gen.load(std::memory_order_acquire)) == EntryState::kOnDisk)
      continue;
    // Already unlinked in this round (with the newer value of its key, by
    // UnlinkWithOlder): nothing to judge, and not corrupt.
    if (!entry_meta_[m].live ||
        StateOf(index_->entry(m).state_gen.load(std::memory_order_acquire)) != EntryState::kComplete)
      return 0;
    if (!CheckedLive(m)) return 0;  // a corrupt member: Tick reclaims it first
    if (MemberHeld(m, now, pins, !alone)) return 0;  // the whole group stays
  }
  // Each member goes with the older values of its key (an upsert the master
  // has not settled yet): evicting only the newest would bring an older
  // value back. A member already taken that way returns 0.
  uint64_t evicted = 0;
  // A member the tier cannot take (its append failed): the group goes whole,
  // its disk-resident members too, rather than split across the tiers.
  if (members.size() > 1 && tier_ && tier_->GroupDropsWhole(grouped)) {
    for (uint64_t m : members)
      if (entry_meta_[m].live && Readable(StateOf(index_->entry(m).state_gen.load(std::memory_order_acquire))))
        evicted += UnlinkWithOlder(m, bytes);
    return evicted;
  }
  for (uint64_t m : members) {
    if (StateOf(index_->entry(m).state_gen.load(std::memory_order_acquire)) != EntryState::kComplete) continue;
    // To the SSD tier when there is one (and bytes, not slots, are wanted).
    evicted += alone && (!tier_ || evict_drop_) ? UnlinkOne(m, bytes) : EvictOrDemote(m, bytes);
  }
  return evicted;
}

uint64_t MasterImpl::EvictCandidate(uint64_t slot, uint64_t now, const PinSet& pins, uint64_t* bytes) {
  if (StateOf(index_->entry(slot).state_gen.load(std::memory_order_acquire)) != EntryState::kOnDisk)
    return EvictWithGroup(slot, now, pins, bytes);
  if (!tier_ || !CheckedLive(slot)) return 0;  // a corrupt stub: Tick reclaims it first
  for (uint64_t m : GroupMembers(slot))
    if (entry_meta_[m].live && MemberHeld(m, now, pins, true)) return 0;  // the whole group stays
  uint64_t n = tier_->DropForIndex(slot, now);  // entries and records; a stub's bytes are not counted
  stats_.index_evicted_disk_keys += n;
  return n;
}

uint64_t MasterImpl::EvictRound(uint64_t bytes, uint64_t entries, const char* why) {
  uint64_t t0 = MonoNs();
  uint64_t used_before = alloc_->used_bytes();
  uint64_t disk_dropped_before = stats_.index_evicted_disk_keys;
  uint64_t now = NowNs();
  uint64_t ttl = config_.default_kv_lease_ttl_ms * 1000000ull;
  PinSet pins;
  (void)ScanPins([&pins](uint64_t g) { pins.gens.insert(g); return false; });  // every pin, once
  uint64_t cap = index_->capacity();
  uint64_t start = RandomSlot();
  uint64_t freed_bytes = 0, freed = 0;
  round_blocked_transiently_ = !pending_.empty() || !pinned_.empty();
  evict_drop_ = entries > 0;  // index slots are wanted: demoting would not free any
  auto met = [&] { return freed_bytes >= bytes && freed >= entries; };
  std::vector<SampledSlot> window;
  // Bytes wanted (not index slots): first from the ahead rounds' sorted
  // window when it is fresh, as an ahead slice would; a new sample (a scan
  // of up to 4096 headers and a sort, ~1-2 ms on the put path) only if that
  // is not enough. Puts faster than the idle slices can evict otherwise paid
  // a whole sample per inline round.
  freed = EvictFromAheadWindow(bytes, entries, now, pins, &freed_bytes);
  for (int pass = 0; pass < 2 && !met(); ++pass) {
    bool soft_pass = pass == 1;
    if (soft_pass && !config_.allow_evict_soft_pinned_objects) break;
    for (uint64_t scanned = 0; scanned < cap && !met();) {
      window.clear();
      uint64_t complete = 0;
      for (; scanned < cap && complete < kSampleSize; ++scanned) {
        uint64_t slot = SampleSlot(start, scanned);
        if (!Evictable(StateOf(index_->entry(slot).state_gen.load(std::memory_order_acquire)), entries > 0))
          continue;
        // No header check here (a miss per sampled object, most of a round's
        // cost): EvictWithGroup checks each candidate it evicts (CheckedLive),
        // and the sample reads only index fields and the master's records.
        ++complete;
        if (SoftPinActive(slot, now) != soft_pass) continue;
        Protection p = Protected(slot, now, pins);
        if (p == Protection::kTransient) round_blocked_transiently_ = true;
        if (p != Protection::kNone) continue;
        window.push_back({LastAccessNs(slot, ttl), slot, index_->entry(slot).state_gen.load(std::memory_order_relaxed)});
      }
      std::sort(window.begin(), window.end());
      size_t used = 0;
      for (; used < window.size() && !met(); ++used) {
        PrefetchVictims(window, used);
        const SampledSlot& c = window[used];
        // An earlier group eviction may have taken this one already.
        if (!Evictable(StateOf(index_->entry(c.slot).state_gen.load(std::memory_order_relaxed)), entries > 0))
          continue;
        freed += EvictCandidate(c.slot, now, pins, &freed_bytes);
      }
      // The rest of a fresh sample becomes the ahead rounds' window: the next
      // round, inline or ahead, continues from it rather than sampling and
      // sorting again (each candidate is re-checked when evicted, and one
      // whose slot changed since is skipped by its state_gen).
      if (!soft_pass && used < window.size()) {
        ahead_window_.assign(window.begin() + long(used), window.end());
        ahead_next_ = 0;
        ahead_sampled_mono_ns_ = MonoNs();
        ahead_scanned_ = ahead_complete_ = 0;
      }
    }
  }
  ++stats_.eviction_rounds;
  if (freed == 0) ++stats_.eviction_rounds_empty;
  stats_.evicted_keys += freed;
  stats_.evicted_bytes += freed_bytes;
  if (bytes == 0) stats_.index_evicted_keys += freed;
  double cap_bytes = double(alloc_->capacity());
  MCXL_LOG(kInfo, "evict", "round %llu (%s): used %.1f%% -> %.1f%%, index %.1f%% in use, evicted %llu objects, "
           "%llu bytes in %.2f ms", (unsigned long long)stats_.eviction_rounds, why,
           100.0 * double(used_before) / cap_bytes, 100.0 * double(alloc_->used_bytes()) / cap_bytes,
           100.0 * double(live_entries_) / double(cap), (unsigned long long)freed, (unsigned long long)freed_bytes,
           double(MonoNs() - t0) / 1e6);
  if (stats_.index_evicted_disk_keys > disk_dropped_before)
    MCXL_LOG(kInfo, "evict", "round %llu: %llu disk-resident objects dropped for index slots (records too)",
             (unsigned long long)stats_.eviction_rounds,
             (unsigned long long)(stats_.index_evicted_disk_keys - disk_dropped_before));
  return freed;
}

bool MasterImpl::AheadWindowUsable(uint64_t mono_ns) const {
  uint64_t ttl = config_.default_kv_lease_ttl_ms * 1000000ull;
  return ahead_next_ != SIZE_MAX && ahead_next_ < ahead_window_.size() &&
         mono_ns - ahead_sampled_mono_ns_ < std::min<uint64_t>(ttl, kNsPerSec);
}

uint64_t MasterImpl::EvictFromAheadWindow(uint64_t bytes, uint64_t entries, uint64_t now, const PinSet& pins,
                                           uint64_t* freed_bytes) {
  if (!AheadWindowUsable(MonoNs())) return 0;  // scanning, used up, or older than a lease
  uint64_t cap = index_->capacity(), freed = 0;
  while ((*freed_bytes < bytes || freed < entries) && ahead_next_ < ahead_window_.size()) {
    PrefetchVictims(ahead_window_, ahead_next_);
    const SampledSlot& c = ahead_window_[ahead_next_++];
    // Still the object sampled; re-checked whole when evicted. A stub
    // gains only a slot: taken only when slots are wanted.
    if (c.slot < cap && index_->entry(c.slot).state_gen.load(std::memory_order_relaxed) == c.state_gen &&
        Evictable(StateOf(c.state_gen), entries > 0))
      freed += EvictCandidate(c.slot, now, pins, freed_bytes);
  }
  return freed;
}

// One slice of an ahead round under mu_: scan the next stretch of the index
// window, or evict the next few of the sorted window. Every candidate is
// re-checked when evicted (EvictWithGroup: state, lease, pins of now,
// group), exactly as an inline round checks it, so a slice may run on a
// window sampled a few milliseconds earlier. Soft-pinned objects are left to
// the inline round (its second pass).
void MasterImpl::EvictAhead(uint64_t budget_ns, const std::function<bool()>& interrupted) {
  std::lock_guard<FencedMutex> lock(mu_);
  uint64_t t_end = MonoNs() + budget_ns;
  auto out_of_time = [&] { return MonoNs() >= t_end || (interrupted && interrupted()); };
  uint64_t cap_bytes = alloc_->capacity();
  double ratio = config_.eviction_ratio;
  uint64_t low = uint64_t(std::max(0.0, config_.eviction_high_watermark_ratio - ratio) * double(cap_bytes));
  // keep: the round met its target with candidates left in the sorted
  // window; the next round starts from them (see below).
  auto done = [&](bool log, bool keep = false) {
    if (ahead_t0_ != 0) {  // a round ends (counted as an inline round is)
      ++stats_.eviction_rounds;
      if (ahead_freed_ == 0) ++stats_.eviction_rounds_empty;
    }
    if (log && ahead_freed_ != 0)
      MCXL_LOG(kInfo, "evict", "round %llu (ahead of the watermark, in idle slices): used %.1f%% -> %.1f%%, "
               "index %.1f%% in use, evicted %llu objects, %llu bytes in %.2f ms",
               (unsigned long long)stats_.eviction_rounds, 100.0 * double(ahead_used_before_) / double(cap_bytes),
               100.0 * double(alloc_->used_bytes()) / double(cap_bytes),
               100.0 * double(live_entries_) / double(index_->capacity()), (unsigned long long)ahead_freed_,
               (unsigned long long)ahead_freed_bytes_, double(MonoNs() - ahead_t0_) / 1e6);
    if (!keep || ahead_next_ == SIZE_MAX || ahead_next_ >= ahead_window_.size()) {
      ahead_window_.clear();
      ahead_next_ = SIZE_MAX;
    }
    ahead_scanned_ = ahead_complete_ = ahead_freed_ = ahead_freed_bytes_ = 0;
    ahead_t0_ = 0;
    evict_ahead_wanted_.store(false, std::memory_order_relaxed);
  };
  // Also with an SSD tier (EvictWithGroup demotes: converts objects with a
  // clean copy, queues the others): bytes queued for demotion count as gone
  // (they are, once written), so a slice does not queue a whole window.
  // Rounds off the put path matter most there: inline, a round costs the
  // put ~1-2 ms per 2000 objects (their header checks).
  auto used_now = [&] { return alloc_->used_bytes() - std::min(alloc_->used_bytes(), EvictPendingBytes()); };
  // The index's load is a reason of its own (its slots, not bytes, wanted).
  uint64_t index_low = IndexLow();
  auto satisfied = [&] { return used_now() <= low && live_entries_ <= index_low; };
  if (pool_lost_ || pool_->failed()) return done(true);
  if (satisfied()) return done(true, true);
  uint64_t cap = index_->capacity();
  uint64_t now = NowNs();
  uint64_t ttl = config_.default_kv_lease_ttl_ms * 1000000ull;
  if (ahead_t0_ == 0) {  // a new round
    ahead_t0_ = MonoNs();
    ahead_used_before_ = alloc_->used_bytes();
    // The previous round's sorted window, when it has candidates left and is
    // younger than a lease (at most 1 s), is still this round's sample: an
    // object read since it was sampled holds a lease and is skipped when
    // re-checked, the others' last access has not changed, objects put since
    // are newer than all of it, and every candidate is re-checked (same
    // object, state, lease, pins, group) when evicted. This saves a whole
    // scan and sort per round (most of the master's eviction work).
    if (!AheadWindowUsable(ahead_t0_)) {
      ahead_start_ = RandomSlot();
      ahead_window_.clear();
      ahead_next_ = SIZE_MAX;
    }
  }
  if (ahead_next_ == SIZE_MAX) {
    // Scanning, in stretches of a few µs: index fields only (as in
    // EvictRound, the header checks are left to the candidates evicted),
    // 128 COMPLETE entries per stretch; disk-resident ones too while the
    // index is past its low mark (their slots are wanted).
    bool slots_wanted = live_entries_ > index_low;
    while (ahead_scanned_ < cap && ahead_complete_ < kSampleSize && !out_of_time()) {
      for (uint64_t n = 0, seen = 0; n < 4096 && seen < 128 && ahead_scanned_ < cap &&
                                     ahead_complete_ < kSampleSize; ++n) {
        uint64_t slot = SampleSlot(ahead_start_, ahead_scanned_++);
        uint64_t sg = index_->entry(slot).state_gen.load(std::memory_order_acquire);
        if (!Evictable(StateOf(sg), slots_wanted)) continue;
        ++seen;
        ++ahead_complete_;
        if (SoftPinActive(slot, now)) continue;
        if (index_->entry(slot).flags.load(std::memory_order_relaxed) & kFlagHardPin) continue;
        ahead_window_.push_back({LastAccessNs(slot, ttl), slot, sg});
      }
    }
    if (ahead_scanned_ < cap && ahead_complete_ < kSampleSize) return;  // more next slice
    std::sort(ahead_window_.begin(), ahead_window_.end());
    ahead_next_ = 0;
    ahead_sampled_mono_ns_ = MonoNs();
    if (out_of_time()) return;
  }
  PinSet pins;
  (void)ScanPins([&pins](uint64_t g) { pins.gens.insert(g); return false; });  // every pin, once
  // Bytes wanted: an SSD tier demotes (the flag outlives EvictRound); only
  // index slots wanted: drop, as demoting frees none.
  bool for_index = used_now() <= low;
  evict_drop_ = for_index;
  if (for_index) NoteIndexDrivesEviction("past its watermark");
  while (ahead_next_ < ahead_window_.size() && !satisfied()) {
    PrefetchVictims(ahead_window_, ahead_next_);
    const SampledSlot& c = ahead_window_[ahead_next_++];
    uint64_t slot = c.slot;
    // Still the object sampled (not gone, nor its slot reused since); the
    // window may predate a replaced pool device: bounded by this index.
    if (slot < cap && index_->entry(slot).state_gen.load(std::memory_order_relaxed) == c.state_gen &&
        Evictable(StateOf(c.state_gen), for_index)) {
      uint64_t b = 0;
      uint64_t n = EvictCandidate(slot, now, pins, &b);
      ahead_freed_ += n;
      ahead_freed_bytes_ += b;
      stats_.evicted_keys += n;
      stats_.evicted_bytes += b;
      if (for_index) stats_.index_evicted_keys += n;
    }
    if (out_of_time()) break;
  }
  if (satisfied()) return done(true, true);
  if (ahead_next_ >= ahead_window_.size()) {  // window used up: sample another
    bool freed_any = ahead_freed_ != 0;
    done(true);
    if (freed_any) evict_ahead_wanted_.store(true, std::memory_order_relaxed);
    // Nothing evictable in a whole window: leave it to the inline round.
  }
}

Result<Extent> MasterImpl::AllocateForPut(uint64_t extent_bytes, std::string_view key) {
  uint64_t cap = alloc_->capacity();
  uint64_t high = uint64_t(config_.eviction_high_watermark_ratio * double(cap));
  uint64_t low = uint64_t(std::max(0.0, config_.eviction_high_watermark_ratio - config_.eviction_ratio) * double(cap));
  // Past the index's watermark: a bounded round (the ahead slices do the rest).
  uint64_t round_entries =
      std::min(kInlineIndexEntries, std::max<uint64_t>(1, live_entries_ + 1 - std::min(live_entries_ + 1, IndexLow())));
  // Above the watermark after this put: make room down to watermark - ratio.
  // Bytes already queued for demotion (SSD tier) are on their way out: not
  // looked for again by a round per put while the tier writes them.
  uint64_t used = alloc_->used_bytes();
  used -= std::min(used, EvictPendingBytes());
  bool over_bytes = used + extent_bytes > high;
  bool over_index = live_entries_ + 1 > IndexLimit();
  if (over_index && !over_bytes) NoteIndexDrivesEviction("past its watermark");
  if (over_bytes || over_index)
    EvictRound(over_bytes ? used + extent_bytes - std::min(low, used + extent_bytes) : 0,
               over_index ? round_entries : 0, over_bytes ? "high watermark" : "index high watermark");
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (live_entries_ + 1 <= IndexLimit()) {
      auto ext = alloc_->Allocate(extent_bytes);
      if (ext) {
        // Past watermark - ratio/2: have the ring server evict in its idle
        // moments (EvictAhead) before a put has to cross the watermark.
        uint64_t ahead = uint64_t(std::max(0.0, config_.eviction_high_watermark_ratio - config_.eviction_ratio / 2) *
                                  double(cap));
        uint64_t now_used = alloc_->used_bytes();
        if (now_used - std::min(now_used, EvictPendingBytes()) > ahead ||  // as EvictAhead counts it
            live_entries_ + 1 > IndexAhead())
          evict_ahead_wanted_.store(true, std::memory_order_relaxed);
        // Pre-demotion: the tier thread copies the coldest objects once the
        // pool's bytes without a copy pass --offload_ahead_ratio.
        if (tier_) tier_->OnAllocated();
        alloc_frontier_.store(ext->offset + ext->size, std::memory_order_relaxed);  // relaxed: a hint (master_impl.h)
        return ext;
      }
    }
    // Fragmented, or the index is full: free more, oldest first.
    uint64_t want = std::max<uint64_t>(extent_bytes, uint64_t(config_.eviction_ratio * double(cap)));
    if (EvictRound(want, live_entries_ + 1 > IndexLimit() ? round_entries : 0, "allocation failed") == 0) break;
  }
  // Leases lapse, views are dropped and puts finish: the client may retry
  // (OBJECT_REPLICA_BUSY never reaches a caller); hard pins do not change.
  bool transient = round_blocked_transiently_;
  MCXL_LOG(kInfo, "master",
           "put of '%.*s' refused: no room for %llu bytes (%llu of %llu used, %llu objects); nothing evictable "
           "%s", int(key.size()), key.data(), (unsigned long long)extent_bytes,
           (unsigned long long)alloc_->used_bytes(), (unsigned long long)cap, (unsigned long long)live_entries_,
           transient ? "right now (leased, viewed or unfinished objects)" : "(hard-pinned objects)");
  return transient ? ErrorCode::OBJECT_REPLICA_BUSY : ErrorCode::NO_AVAILABLE_HANDLE;
}

uint64_t MasterImpl::EvictInWindow(uint64_t hash) {
  uint64_t now = NowNs(), ttl = config_.default_kv_lease_ttl_ms * 1000000ull;
  uint64_t cap = index_->capacity(), home = index_->HomeSlot(hash);
  PinSet pins;
  (void)ScanPins([&pins](uint64_t g) { pins.gens.insert(g); return false; });  // every pin, once
  round_blocked_transiently_ = false;
  evict_drop_ = true;  // a slot is wanted: demoting would keep the entry
  struct Candidate {
    uint64_t last_access, slot;
  };
  std::vector<Candidate> window;
  // Soft-pinned objects only when nothing else is, and when allowed.
  for (int pass = 0; pass < 2 && window.empty(); ++pass) {
    if (pass == 1 && !config_.allow_evict_soft_pinned_objects) break;
    for (uint64_t i = 0; i < std::min(cap, ObjectIndex::kMaxProbeSlots); ++i) {
      uint64_t slot = (home + i) & (cap - 1);
      EntryState st = StateOf(index_->entry(slot).state_gen.load(std::memory_order_acquire));
      if (st == EntryState::kWriting) round_blocked_transiently_ = true;  // its put may finish and go
      if (!Evictable(st, true)) continue;
      if (SoftPinActive(slot, now) != (pass == 1)) continue;
      Protection p = Protected(slot, now, pins);
      if (p == Protection::kTransient) round_blocked_transiently_ = true;
      if (p == Protection::kNone) window.push_back({LastAccessNs(slot, ttl), slot});
    }
  }
  std::sort(window.begin(), window.end(),
            [](const Candidate& a, const Candidate& b) { return a.last_access < b.last_access; });
  uint64_t freed = 0, bytes = 0;
  // The oldest kWindowEvictions that go (groups whole): one scan and sort
  // for them (the index is at its watermark: each put frees a slot somewhere
  // anyway, and these are the slots new keys want).
  // The ones after the first only while at least half as old as it: a window
  // holding just-written objects gives up its oldest only.
  for (size_t i = 0, taken = 0; i < window.size() && taken < kWindowEvictions; ++i) {
    if (taken > 0 && window[i].last_access > window[0].last_access + (now - std::min(now, window[0].last_access)) / 2)
      break;
    PrefetchVictims(window, i);
    uint64_t n = EvictCandidate(window[i].slot, now, pins, &bytes);
    freed += n;
    taken += n > 0;
  }
  stats_.evicted_keys += freed;
  stats_.evicted_bytes += bytes;
  stats_.index_evicted_keys += freed;
  stats_.index_window_evictions += freed;
  if (freed > 0) NoteIndexDrivesEviction("a new key's probe window was full");
  return freed;
}

void MasterImpl::NoteIndexDrivesEviction(const char* why) {
  if (index_drive_logged_) return;
  index_drive_logged_ = true;
  uint64_t cap = index_->capacity();
  uint64_t mean = live_entries_ ? alloc_->used_bytes() / live_entries_ : 0;
  MCXL_LOG(kWarn, "master", "the object index, not the data region, now drives eviction (%s): %llu of its %llu "
           "entries in use (--index_high_watermark_ratio=%.2f) with %.1f%% of the data region used; objects average %llu "
           "bytes of pool, and the index has one entry per %llu bytes. To keep more small objects, format the pool "
           "with a larger --index_capacity (64 bytes of pool per entry)",
           why, (unsigned long long)live_entries_, (unsigned long long)cap, config_.index_high_watermark_ratio,
           100.0 * double(alloc_->used_bytes()) / double(std::max<uint64_t>(1, alloc_->capacity())),
           (unsigned long long)mean, (unsigned long long)(pool_->size() / cap));
}

}  // namespace mcxl
