// The tier's capacity and groups across the tiers: over its watermark the
// tier drops its least recently used objects (entry and record, a group
// whole or not at all), then writes tombstones and compacts; eviction drops
// a group whole when a member could not be appended. Contract in
// tier_manager.h ("Capacity", "Groups").
//
// Atomics follow the three rules stated in master_impl.h.
#include <algorithm>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "tier_manager.h"

namespace mcxl {

bool TierManager::GroupDropsWhole(const std::vector<uint64_t>& members) const {
  for (uint64_t m : members) {
    if (!host_.Record(m).live) continue;
    uint64_t sg = host_.index().entry(m).state_gen.load(std::memory_order_acquire);
    if (StateOf(sg) != EntryState::kComplete) continue;
    auto nd = no_disk_.find(m);
    if (nd != no_disk_.end() && nd->second == sg) return true;
  }
  return false;
}

uint64_t TierManager::DropWithGroup(uint64_t slot, uint64_t now, uint64_t* bytes) {
  const ObjectIndex& index = host_.index();
  std::vector<uint64_t> members = host_.GroupMembers(slot);
  // Together or not at all (as eviction's groups): a member a reader holds,
  // hard-pinned or unfinished keeps the whole group.
  for (uint64_t m : members) {
    if (!host_.Record(m).live) continue;
    const IndexEntry& e = index.entry(m);
    EntryState st = StateOf(e.state_gen.load(std::memory_order_acquire));
    if (!Readable(st)) return 0;
    if ((e.flags.load(std::memory_order_relaxed) & kFlagHardPin) || index.LeaseUntil(m) > now) return 0;
    if (st == EntryState::kComplete && host_.IsPinned(GenOf(e.state_gen.load(std::memory_order_relaxed)))) return 0;
  }
  uint64_t n = 0;
  for (uint64_t m : members) {
    if (!host_.Record(m).live || !Readable(StateOf(index.entry(m).state_gen.load(std::memory_order_acquire))))
      continue;
    if (bytes != nullptr) *bytes += index.entry(m).value_size.load(std::memory_order_relaxed);
    n += host_.UnlinkWithOlder(m, nullptr);  // its record goes with it (ForgetDiskCopy)
  }
  return n;
}

bool TierManager::Housekeeping() {
  // The filesystem's free space, a few times a second: the capacity follows
  // it down (another program filled it) and back up (space returned).
  if (MonoNs() - space_mono_ > 200 * 1000000ull) {
    space_mono_ = MonoNs();
    tier::CloseDeletedReaderFds();  // promotions' reads: deleted segments must not keep their space
    disk_->RefreshSpace();
    tier::Stats fresh = disk_->stats();
    std::lock_guard<FencedMutex> lock(host_.mu());
    disk_stats_ = fresh;
  }
  {
    std::lock_guard<FencedMutex> lock(host_.mu());
    // What the filesystem leaves, not only the flag: a drop target sized
    // from a capacity the disk does not have would empty the tier.
    uint64_t cap = std::min(config_.offload_capacity_bytes, disk_stats_.capacity_effective);
    uint64_t high = uint64_t(config_.offload_high_watermark_ratio * double(cap));
    if (disk_stats_.live_bytes > high || full_) {
      // Drop the tier's least recently used objects down to 90% of the
      // watermark (entries and records): sampled like the pool's eviction.
      uint64_t low = uint64_t(0.9 * double(high));
      uint64_t target = disk_stats_.live_bytes > low ? disk_stats_.live_bytes - low : 0;
      // An append found no room: drop only what live records keep from 5% of
      // the capacity; garbage beyond that is compaction's to reclaim.
      if (full_ && disk_stats_.live_bytes + cap / 20 > cap)
        target = std::max<uint64_t>(target, disk_stats_.live_bytes + cap / 20 - cap);
      uint64_t ttl = config_.default_kv_lease_ttl_ms * 1000000ull;
      uint64_t now = NowNs();
      const ObjectIndex& index = host_.index();
      std::vector<std::pair<uint64_t, uint64_t>> cand;  // (last access, slot)
      // Bounded under the lock: at most kLruVisits entries per turn (skipped
      // pinned/leased ones count too), from a bucket that rotates between turns.
      constexpr size_t kLruVisits = 16384;
      const size_t nb = disk_loc_.bucket_count();
      size_t visited = 0, k = 0;
      for (; k < nb && visited < kLruVisits && cand.size() < 4096; ++k) {
        size_t b = (lru_bucket_ + k) % nb;
        for (auto it = disk_loc_.begin(b); it != disk_loc_.end(b); ++it) {
          ++visited;
          uint64_t s = it->first;
          uint64_t sg = index.entry(s).state_gen.load(std::memory_order_acquire);
          if (StateOf(sg) != EntryState::kOnDisk) continue;
          if (index.entry(s).flags.load(std::memory_order_relaxed) & kFlagHardPin) continue;
          if (index.LeaseUntil(s) > now) continue;
          cand.emplace_back(host_.LastAccessNs(s, ttl), s);
        }
      }
      lru_bucket_ = nb == 0 ? 0 : (lru_bucket_ + k) % nb;
      std::sort(cand.begin(), cand.end());
      uint64_t dropped = 0, n = 0;
      for (const auto& c : cand) {
        if (dropped >= target) break;
        // Taken already with a group member dropped before it?
        if (!host_.Record(c.second).live ||
            StateOf(index.entry(c.second).state_gen.load(std::memory_order_acquire)) != EntryState::kOnDisk)
          continue;
        n += DropWithGroup(c.second, now, &dropped);  // with its group; records go too
      }
      counters_.tier_evictions += n;
      uint64_t now_mono = MonoNs();
      if (n > 0 && now_mono - drop_log_mono_ > kNsPerSec) {
        drop_log_mono_ = now_mono;
        MCXL_LOG(kInfo, "tier", "SSD tier over its watermark (%llu of %llu bytes live): dropped %llu objects",
                 (unsigned long long)disk_stats_.live_bytes, (unsigned long long)cap, (unsigned long long)n);
      }
      full_ = false;
    }
  }
  bool wrote = FlushTombstones();
  tier::Stats ts = disk_->stats();
  bool compacted = false, compact_failing = false;
  const uint64_t garbage = ts.used_bytes - std::min(ts.used_bytes, ts.live_bytes);
  // Near its capacity (or degraded: a full filesystem) any garbage is worth
  // a look for a victim: there is no other way to get the space back.
  const uint64_t cap = std::min(config_.offload_capacity_bytes, ts.capacity_effective);
  const bool tight = degraded_ || double(ts.used_bytes) > 0.9 * double(cap);
  const bool want = ts.used_bytes > 0 && (double(garbage) > 0.5 * double(ts.used_bytes) || (tight && garbage > 0));
  if (want && MonoNs() >= compact_retry_mono_) {
    uint64_t before = ts.compactions;
    // 64 MiB a turn in 4 MiB steps, tombstones written in between: a remove
    // waits for at most one step's copy, not the whole turn.
    for (int step = 0; step < 16 && ts.compactions == before; ++step) {
      if (!disk_->Compact(4ull << 20).ok()) {
        compact_failing = true;
        break;
      }
      ts = disk_->stats();
      wrote |= FlushTombstones();
    }
    ts = disk_->stats();
    compacted = ts.compactions != before;
    compact_backoff_ns_ = compact_failing ? std::clamp<uint64_t>(2 * compact_backoff_ns_, 50000000ull, 2 * kNsPerSec) : 0;
    compact_retry_mono_ = compact_failing ? MonoNs() + compact_backoff_ns_ : 0;
  }
  std::lock_guard<FencedMutex> lock(host_.mu());
  disk_stats_ = ts;
  UpdateDegraded(!removals_.empty() && tomb_retry_mono_ != 0, compact_failing);
  return wrote || compacted;
}

void TierManager::UpdateDegraded(bool tomb_failing, bool compact_failing) {
  const bool enospc = disk_stats_.enospc != enospc_seen_;
  enospc_seen_ = disk_stats_.enospc;
  // Degraded from the first ENOSPC (or a filesystem filled by another
  // writer) until a pass sees neither and nothing waits for space.
  const bool now = enospc || disk_stats_.fs_full || (degraded_ && (tomb_failing || compact_failing));
  if (now == degraded_) return;
  degraded_ = now;
  if (now)
    MCXL_LOG(kWarn, "tier", "SSD tier degraded: its filesystem (%s) is full, %llu bytes free; the tier now holds at "
             "most %llu bytes (configured %llu), drops its least recently used objects to fit%s",
             config_.root_fs_dir.c_str(), (unsigned long long)disk_stats_.fs_free_bytes,
             (unsigned long long)disk_stats_.capacity_effective, (unsigned long long)config_.offload_capacity_bytes,
             tomb_failing ? ", and removes wait for their tombstones" : "");
  else
    MCXL_LOG(kInfo, "tier", "SSD tier no longer degraded: %llu bytes free, capacity %llu bytes; demotion resumes",
             (unsigned long long)disk_stats_.fs_free_bytes, (unsigned long long)disk_stats_.capacity_effective);
}

}  // namespace mcxl
