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
  {
    std::lock_guard<FencedMutex> lock(host_.mu());
    uint64_t cap = config_.offload_capacity_bytes;
    uint64_t high = uint64_t(config_.offload_high_watermark_ratio * double(cap));
    if (disk_stats_.live_bytes > high || full_) {
      // Drop the tier's least recently used objects down to 90% of the
      // watermark (entries and records): sampled like the pool's eviction.
      uint64_t low = uint64_t(0.9 * double(high));
      uint64_t target = disk_stats_.live_bytes > low ? disk_stats_.live_bytes - low : 0;
      if (full_) target = std::max<uint64_t>(target, cap / 20);
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
      if (n > 0)
        MCXL_LOG(kInfo, "tier", "SSD tier over its watermark (%llu of %llu bytes live): dropped %llu objects",
                 (unsigned long long)disk_stats_.live_bytes, (unsigned long long)cap, (unsigned long long)n);
      full_ = false;
    }
  }
  bool wrote = FlushTombstones();
  tier::Stats ts = disk_->stats();
  bool compacted = false;
  if (ts.used_bytes > 0 && double(ts.used_bytes - std::min(ts.used_bytes, ts.live_bytes)) > 0.5 * double(ts.used_bytes)) {
    uint64_t before = ts.compactions;
    // 64 MiB a turn in 4 MiB steps, tombstones written in between: a remove
    // waits for at most one step's copy, not the whole turn.
    for (int step = 0; step < 16 && ts.compactions == before; ++step) {
      if (!disk_->Compact(4ull << 20).ok()) break;
      ts = disk_->stats();
      wrote |= FlushTombstones();
    }
    ts = disk_->stats();
    compacted = ts.compactions != before;
  }
  std::lock_guard<FencedMutex> lock(host_.mu());
  disk_stats_ = ts;
  return wrote || compacted;
}

}  // namespace mcxl
