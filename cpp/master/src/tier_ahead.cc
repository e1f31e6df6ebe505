// Pre-demotion (--offload_ahead_ratio): clean copies of the objects
// eviction would pick next, written by the tier thread before the pool
// reaches its watermark, so that eviction only converts. Contract in
// tier_manager.h ("Pre-demotion").
//
// Atomics follow the three rules stated in master_impl.h.
#include <algorithm>

#include "mooncake_cxl/common/clock.h"
#include "tier_manager.h"

namespace mcxl {

uint64_t TierManager::PoolDirtyBytes() const {
  uint64_t used = host_.alloc().used_bytes();
  return used - std::min(used, pool_clean_bytes_);
}

bool TierManager::AheadWanted() const {
  if (!config_.offload_on_evict || config_.offload_ahead_ratio <= 0 || host_.pool_lost()) return false;
  return PoolDirtyBytes() > uint64_t(config_.offload_ahead_ratio * double(host_.alloc().capacity()));
}

void TierManager::OnAllocated() {
  if (config_.offload_ahead_ratio > 0) last_put_mono_ = MonoNs();
  if (!pre_kicked_ && AheadWanted()) {
    pre_kicked_ = true;
    Wake();
  }
}

bool TierManager::DemoteAhead() {
  // Per call under the lock: at most kScanSlots index slots scanned, one
  // window of candidates walked, kBatchBytes / kBatchJobs taken; the write
  // is WriteDemoteBatch's (without the lock). The extents of a batch stay
  // allocated until it is written, even when their objects go meanwhile: at
  // most 1/32 of a small pool.
  constexpr size_t kBatchJobs = 512;
  constexpr uint64_t kScanSlots = 65536;
  constexpr uint64_t kWindow = 4096;          // COMPLETE entries per sample, as eviction's
  constexpr uint64_t kSoftLast = 1ull << 63;  // soft-pinned members sort after all others
  std::vector<DemoteItem> batch;
  uint64_t batch_bytes = 0;
  {
    std::lock_guard<FencedMutex> lock(host_.mu());
    if (!AheadWanted() || full_) {
      pre_kicked_ = false;  // the next put past the threshold wakes us again
      return false;
    }
    uint64_t mono = MonoNs();
    // Eviction's demotions first; after an empty sample or a failed write,
    // not before pre_retry_mono_ (Loop polls: pre_kicked_ stays set).
    if (!demote_q_.empty() || mono < pre_retry_mono_) return false;
    const ObjectIndex& index = host_.index();
    const uint64_t pool_cap = host_.alloc().capacity();
    // Background work: while puts arrive (one in the last kQuietNs) the
    // copies wait for a pause, which leaves the CPU (a copy costs a memcpy
    // and a crc of every byte) to the puts, unless they fall behind: dirty
    // bytes past halfway from the threshold to the watermark.
    constexpr uint64_t kQuietNs = 1000000;
    const uint64_t threshold = uint64_t(config_.offload_ahead_ratio * double(pool_cap));
    uint64_t high = uint64_t(config_.eviction_high_watermark_ratio * double(pool_cap));
    uint64_t urgent = threshold + (high > threshold ? (high - threshold) / 2 : 0);
    if (mono - last_put_mono_ < kQuietNs && PoolDirtyBytes() < urgent) {
      pre_retry_mono_ = last_put_mono_ + kQuietNs;
      return false;
    }
    uint64_t cap = index.capacity();
    uint64_t ttl = config_.default_kv_lease_ttl_ms * 1000000ull;
    uint64_t now = NowNs();
    // A sorted window is used until spent or older than a lease (<= 1 s):
    // objects put since are newer than all of it; ones read since are
    // skipped below (their last access moved).
    if (pre_next_ != SIZE_MAX &&
        (pre_next_ >= pre_window_.size() || mono - pre_sampled_mono_ > std::min<uint64_t>(ttl, kNsPerSec))) {
      pre_window_.clear();
      pre_next_ = SIZE_MAX;
      pre_scanned_ = pre_complete_ = 0;
    }
    if (pre_next_ == SIZE_MAX) {
      if (pre_scanned_ == 0) {  // a new sample, from a random point (as EvictRound)
        pre_start_ = host_.RandomSlot();
        pre_window_.clear();
      }
      for (uint64_t n = 0; n < kScanSlots && pre_scanned_ < cap && pre_complete_ < kWindow; ++n) {
        uint64_t slot = (pre_start_ + pre_scanned_++) & (cap - 1);
        uint64_t sg = index.entry(slot).state_gen.load(std::memory_order_acquire);
        // The object header is checked (CheckedLive) only when a candidate
        // is taken below: here, the master's own record is enough.
        if (StateOf(sg) != EntryState::kComplete || !host_.Record(slot).live) continue;
        ++pre_complete_;
        if (disk_loc_.count(slot) != 0) continue;  // clean already
        // Eviction's rules: hard pins never leave the pool; soft pins only
        // in its second pass, when allowed.
        if (index.entry(slot).flags.load(std::memory_order_relaxed) & kFlagHardPin) continue;
        bool soft = host_.SoftPinActive(slot, now);
        if (soft && !config_.allow_evict_soft_pinned_objects) continue;
        pre_window_.push_back({(soft ? kSoftLast : 0) | host_.LastAccessNs(slot, ttl), slot, sg});
      }
      if (pre_scanned_ < cap && pre_complete_ < kWindow) return true;  // more on the next call
      std::sort(pre_window_.begin(), pre_window_.end());
      pre_next_ = 0;
      pre_sampled_mono_ = mono;
    }
    uint64_t dirty = PoolDirtyBytes();
    const uint64_t kBatchBytes = std::clamp<uint64_t>(pool_cap / 32, 256ull << 10, 4ull << 20);
    while (pre_next_ < pre_window_.size() && batch_bytes < kBatchBytes && batch.size() < kBatchJobs &&
           dirty > threshold + batch_bytes) {
      const SampledSlot c = pre_window_[pre_next_++];
      uint64_t s = c.slot;
      // Still the object sampled, still without a record or a demotion in
      // flight, not read since (then it is not among the coldest), and not
      // an upsert with an older value of its key still there (eviction
      // drops those; an older generation would not even append).
      if (s >= cap || index.entry(s).state_gen.load(std::memory_order_acquire) != c.state_gen ||
          !host_.Record(s).live || !host_.CheckedLive(s))
        continue;
      if (disk_loc_.count(s) != 0 || demote_queued_.count(s) != 0 || no_disk_.count(s) != 0) continue;
      if (host_.LastAccessNs(s, ttl) != (c.last_access & ~kSoftLast)) continue;
      if (index.entry(s).flags.load(std::memory_order_relaxed) & kFlagHardPin) continue;
      std::vector<uint64_t> live;
      host_.FindLive(host_.KeyOf(s), index.entry(s).key_hash.load(std::memory_order_relaxed), &live);
      bool alone = true;
      for (uint64_t o : live)
        if (o != s && Readable(StateOf(index.entry(o).state_gen.load(std::memory_order_acquire)))) alone = false;
      if (!alone || host_.NewerWriting(s)) continue;  // (an upsert being written decides its settle without a record)
      AddToDemoteBatch({s, c.state_gen, false}, &batch, &batch_bytes);
    }
    if (batch.empty() && pre_next_ >= pre_window_.size()) {
      // A spent window with nothing to copy: the next sample may find some,
      // unless this one covered the whole index (then wait a little: the
      // dirty bytes are unfinished puts, pinned or just read objects).
      if (pre_scanned_ >= cap) pre_retry_mono_ = mono + 5 * 1000000ull;
      return pre_scanned_ < cap;
    }
  }
  if (batch.empty()) return true;
  WriteDemoteBatch(&batch, true);
  return true;
}

}  // namespace mcxl
