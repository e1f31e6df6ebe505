// Recovery: a master started on a formatted pool without --format rebuilds
// its state from the pool alone. Contract: every COMPLETE entry whose object
// header checks out is kept and its extent reserved in the allocator; a key
// with two COMPLETE entries (an upsert caught mid-flight) keeps the newest;
// unfinished puts are revoked with the same CAS their client would use to
// publish (so exactly one side wins), and their extents stay reserved until
// the owner's process is gone (a client of this machine) or, for a remote
// owner, --put_start_release_timeout_sec passes; client slots of the previous
// incarnation are cleared, except that a slot whose process may be alive and
// holds views is retired with its pin table, and the extents those views show
// are kept (master_pins.cc).
//
// Atomics follow the three rules stated in master_impl.h.
#include "master_impl.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/shm_ring.h"
#include "mooncake_cxl/master/warm_scan.h"

namespace mcxl {

void MasterImpl::Recover() {
  RecoverAnnounceChannels();  // reads the client table as the last master left it
  // Pids of the previous incarnation's clients, to free their unfinished
  // extents at once when they are dead.
  std::vector<uint64_t> old_pid(clients_.size(), 0);
  for (uint32_t i = 0; i < clients_.size(); ++i) {
    ClientSlot* cs = pool_->client_slot(i);
    // Only a client of this machine can be known dead by its pid.
    if (cs->generation.load(std::memory_order_relaxed) != 0 &&
        cs->machine_hash.load(std::memory_order_relaxed) == KeyHash(machine_))
      old_pid[i] = cs->pid.load(std::memory_order_relaxed);
    // Every client re-attaches; one whose process may be alive and holds
    // views keeps its slot and pins (retired until it re-attaches).
    RecoverPinTable(i);
  }
  PublishRange(pool_->client_slot(0), clients_.size() * sizeof(ClientSlot));

  // What the checked header copy said (never re-read from the pool).
  struct Found {
    uint64_t slot, offset, extent, generation, group, key_hash;
    uint32_t key_len, seen;  // seen: its index in the standby's scan, or WarmScan::kNone
  };
  std::vector<Found> complete, unfinished;
  std::vector<std::pair<uint64_t, uint64_t>> segment_dropped;  // (key hash, generation) of dropped kInSegment entries
  // Generations grow by one per put: one this large was written by someone else.
  constexpr uint64_t kMaxSaneGeneration = 1ull << 55;
  uint64_t capacity = index_->capacity();
  // Headers lie all over the data region, in no order the index follows: a
  // prefetch this many slots ahead overlaps their cache and TLB misses (a
  // hint only: it never faults, and the header is checked when read).
  constexpr uint64_t kHeaderPrefetch = 16;
  // A standby's scan (warm_scan.h) stands in for the headers of entries that
  // have not changed since; it makes the prefetch pointless.
  std::unique_ptr<WarmScan> warm = std::move(warm_);
  if (warm) warm->Stop();
  uint64_t from_warm = 0;
  // Where each entry of the scan that still holds sits in `complete`.
  std::vector<uint32_t> found_at(warm ? warm->size() : 0, WarmScan::kNone);
  const uint64_t t0 = MonoNs();
  for (uint64_t slot = 0; slot < capacity; ++slot) {
    if (!warm && slot + kHeaderPrefetch < capacity) {
      uint64_t ahead = index_->entry(slot + kHeaderPrefetch).object_offset.load(std::memory_order_relaxed);
      if (ahead != 0 && pool_->InDataRegion(ahead, sizeof(ObjectHeader)))
        __builtin_prefetch(pool_->At<const char>(ahead));
    }
    IndexEntry& e = index_->entry(slot);
    index_->RepairVersion(slot);
    uint64_t sg = e.state_gen.load(std::memory_order_acquire);
    bool sane_gen = GenOf(sg) < kMaxSaneGeneration;
    if (sane_gen) next_generation_ = std::max(next_generation_, GenOf(sg) + 1);
    EntryState st = StateOf(sg);
    if (st == EntryState::kEmpty || st == EntryState::kTombstone) continue;
    uint64_t off = e.object_offset.load(std::memory_order_relaxed);
    ObjectHeader h;
    uint32_t seen = warm && st == EntryState::kComplete ? warm->Find(slot, sg, off) : WarmScan::kNone;
    if (seen != WarmScan::kNone) h = warm->header(seen), ++from_warm;
    bool ok = sane_gen && (seen != WarmScan::kNone || CheckedObjectHeader(*pool_, off, &h)) &&
              h.key_hash == e.key_hash.load(std::memory_order_relaxed) &&
              h.value_size == e.value_size.load(std::memory_order_relaxed) && h.generation == GenOf(sg);
    // A live client of the previous incarnation may publish an unfinished
    // put this very moment: revoke with the same CAS it uses, so exactly one
    // of us wins, and keep the put if it won.
    if (st == EntryState::kWriting && ok && !index_->Abort(slot, GenOf(sg)))
      st = StateOf(e.state_gen.load(std::memory_order_acquire));
    Found f{slot, off, h.extent_size, GenOf(sg), h.group_hash, h.key_hash, h.key_len, seen};
    if (st == EntryState::kInSegment && ok) {
      // A restarted master cannot know the segment kept its bytes (its
      // owner re-attaches with a new generation): the object is a miss,
      // and so are the older values of its key (below).
      index_->Tombstone(slot);
      ++stats_.dropped_on_recovery;
      segment_dropped.emplace_back(h.key_hash, GenOf(sg));
    } else if (Readable(st) && ok) {
      if (seen != WarmScan::kNone) found_at[seen] = uint32_t(complete.size());
      complete.push_back(f);
    } else if ((st == EntryState::kWriting || st == EntryState::kAborted) && ok) {
      unfinished.push_back(f);
    } else {
      MCXL_LOG(kWarn, "master", "recovery: entry %llu (state %d) has no valid object header; dropped",
               (unsigned long long)slot, int(st));
      index_->Tombstone(slot);
      ++stats_.dropped_on_recovery;
    }
  }
  const uint64_t t_scan = MonoNs();
  // Reserve in address order (the allocator's fast path for recovery).
  auto by_offset = [](const Found& a, const Found& b) { return a.offset < b.offset; };
  uint64_t max_probe = 0;  // recomputed from what is kept: the shared word may have been overwritten
  if (!warm) {
    std::sort(complete.begin(), complete.end(), by_offset);
  } else {
    // The standby sorted what it saw: merge those still found with the few
    // entries it did not see (the same order a sort gives).
    std::vector<Found> sorted, unseen;
    for (const Found& f : complete)
      if (f.seen == WarmScan::kNone) unseen.push_back(f);
    std::sort(unseen.begin(), unseen.end(), by_offset);
    sorted.reserve(complete.size());
    size_t u = 0;
    for (const WarmScan::ByOffset& w : warm->by_offset()) {
      uint32_t at = found_at[w.seen];
      if (at == WarmScan::kNone) continue;
      while (u < unseen.size() && unseen[u].offset < w.offset) sorted.push_back(unseen[u++]);
      sorted.push_back(complete[at]);
    }
    while (u < unseen.size()) sorted.push_back(unseen[u++]);
    complete = std::move(sorted);
  }
  const uint64_t t_sort = MonoNs();
  // (key hash, slot) of every kept entry: sorted, a key's entries are adjacent
  // (one flat vector: a map of a million small vectors costs a second here).
  std::vector<std::pair<uint64_t, uint64_t>> by_hash;
  by_hash.reserve(complete.size());
  std::vector<uint8_t> kept(found_at.size(), 0);  // of the scan's entries
  // Slots come in address order here, so their metadata is touched at random:
  // prefetched like the headers above (a hint only).
  for (size_t i = 0; i < complete.size(); ++i) {
    if (i + kHeaderPrefetch < complete.size()) __builtin_prefetch(&entry_meta_[complete[i + kHeaderPrefetch].slot], 1);
    const Found& f = complete[i];
    // Insert never places an entry kMaxProbeSlots or more from its home:
    // one there was written by someone else, and the master's lookups (its
    // shadow's window) would not see it, so a new put of its key could
    // leave it behind to come back after a remove.
    uint64_t distance = (f.slot - index_->HomeSlot(f.key_hash)) & (capacity - 1);
    if (distance >= ObjectIndex::kMaxProbeSlots) {
      MCXL_LOG(kWarn, "master", "recovery: entry %llu lies %llu slots past its key's home (Insert places none past "
               "%llu); dropped", (unsigned long long)f.slot, (unsigned long long)distance,
               (unsigned long long)(ObjectIndex::kMaxProbeSlots - 1));
      index_->Tombstone(f.slot);
      ++stats_.dropped_on_recovery;
      continue;
    }
    auto ext = alloc_->Reserve(f.offset, f.extent);
    if (!ext) {
      MCXL_LOG(kWarn, "master", "recovery: entry %llu overlaps another object; dropped",
               (unsigned long long)f.slot);
      index_->Tombstone(f.slot);
      ++stats_.dropped_on_recovery;
      continue;
    }
    entry_meta_[f.slot] = EntryMeta{ext->handle, f.key_len, true, false, false};
    AddToGroup(f.slot, f.group);
    ++live_entries_;
    // The header's key hash, checked equal to the entry's (no second random read of it).
    max_probe = std::max(max_probe, distance);
    CountComplete(f.slot);
    if (f.seen != WarmScan::kNone) kept[f.seen] = 1;  // taken in the scan's order below
    else by_hash.emplace_back(f.key_hash, f.slot);
  }
  const uint64_t t_reserve = MonoNs();
  index_->SetMaxProbe(max_probe);
  ReservePinnedExtents();  // objects unlinked while viewed keep their extents
  // An upsert caught mid-flight leaves two COMPLETE entries of one key: keep
  // the newest.
  std::sort(by_hash.begin(), by_hash.end());
  if (warm) {  // the kept entries the standby saw, merged in (the order a sort gives)
    std::vector<std::pair<uint64_t, uint64_t>> merged, unseen = std::move(by_hash);
    merged.reserve(unseen.size() + complete.size());
    size_t u = 0;
    for (const WarmScan::ByHash& w : warm->by_hash()) {
      if (!kept[w.seen]) continue;
      std::pair<uint64_t, uint64_t> p{w.key_hash, w.slot};
      while (u < unseen.size() && unseen[u] < p) merged.push_back(unseen[u++]);
      merged.push_back(p);
    }
    while (u < unseen.size()) merged.push_back(unseen[u++]);
    by_hash = std::move(merged);
  }
  for (size_t i = 0; i < by_hash.size();) {
    size_t end = i + 1;
    while (end < by_hash.size() && by_hash[end].first == by_hash[i].first) ++end;
    uint64_t hash = by_hash[i].first;
    if (end + kHeaderPrefetch < by_hash.size()) __builtin_prefetch(&index_->entry(by_hash[end + kHeaderPrefetch].second));
    if (end - i < 2) {
      uint64_t slot = by_hash[i].second;
      uint32_t fl = index_->entry(slot).flags.load(std::memory_order_relaxed);
      if (fl & kFlagSuperseded) index_->SetFlags(slot, fl & ~kFlagSuperseded);
    } else {
      for (size_t k = i; k < end; ++k) {
        uint64_t slot = by_hash[k].second;
        if (!Readable(StateOf(index_->entry(slot).state_gen.load(std::memory_order_relaxed))))
          continue;  // unlinked as an older value of a key handled just before
        ClearSupersededIfSettled(std::string(KeyOf(slot)), hash);
      }
    }
    i = end;
  }
  // A dropped segment entry may be the newest value of a key an upsert
  // caught mid-flight: the key's older kept entries must not come back as
  // its value. Dropped by hash (a colliding key's older entry too: a miss).
  if (!segment_dropped.empty()) {
    std::sort(segment_dropped.begin(), segment_dropped.end());
    for (const auto& [hash, slot] : by_hash) {
      auto it = std::lower_bound(segment_dropped.begin(), segment_dropped.end(), std::make_pair(hash, uint64_t(0)));
      uint64_t newest_dropped = 0;
      for (; it != segment_dropped.end() && it->first == hash; ++it) newest_dropped = std::max(newest_dropped, it->second);
      uint64_t sg = index_->entry(slot).state_gen.load(std::memory_order_relaxed);
      if (newest_dropped == 0 || !Readable(StateOf(sg)) || GenOf(sg) >= newest_dropped) continue;
      MCXL_LOG(kInfo, "master", "recovery: entry %llu is an older value of a key whose newest was in a DRAM "
               "segment; dropped", (unsigned long long)slot);
      Unlink(slot, true, 0);
      ++stats_.dropped_on_recovery;
    }
  }
  const uint64_t t_keys = MonoNs();
  // Unfinished puts: revoke. Their extents are reserved (a live client of the
  // old incarnation might still write) and released once its local process
  // is gone, or after the release timeout for a remote owner.
  uint64_t release_at = MonoNs() + config_.put_start_release_timeout_sec * kNsPerSec;
  for (const Found& f : unfinished) {
    IndexEntry& e = index_->entry(f.slot);
    uint32_t owner = e.owner_slot.load(std::memory_order_relaxed);
    bool dead = owner < old_pid.size() && old_pid[owner] != 0 && LocalPidDead(old_pid[owner]);
    auto ext = alloc_->Reserve(f.offset, f.extent);
    index_->Tombstone(f.slot);
    ++stats_.revoked_puts;
    if (!ext) continue;  // overlapped a kept object: it was never ours to free
    if (dead) (void)alloc_->Free(ext->handle);
    else deferred_.push_back({ext->handle, release_at, owner < old_pid.size() ? old_pid[owner] : 0});
  }
  stats_.recovered_objects = stats_.complete_keys;
  MCXL_LOG(kInfo, "master", "recovery: kept %llu objects (%llu headers known from the standby's scan), "
           "revoked %zu unfinished puts, dropped %llu in %.0f ms (scan %.0f, sort %.0f, reserve %.0f, keys %.0f)",
           (unsigned long long)stats_.complete_keys, (unsigned long long)from_warm, unfinished.size(),
           (unsigned long long)stats_.dropped_on_recovery, (MonoNs() - t0) / 1e6, (t_scan - t0) / 1e6,
           (t_sort - t_scan) / 1e6, (t_reserve - t_sort) / 1e6, (t_keys - t_reserve) / 1e6);
}

}  // namespace mcxl
