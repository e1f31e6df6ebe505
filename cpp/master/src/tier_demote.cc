// Demotion: eviction's hook (EvictOrDemote), write-through copies, and the
// tier thread's batches (DemoteBatch, WriteDemoteBatch). Contract in
// tier_manager.h ("Demotion").
//
// Atomics follow the three rules stated in master_impl.h.
#include <algorithm>
#include <chrono>
#include <thread>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "tier_manager.h"

namespace mcxl {

uint64_t TierManager::EvictOrDemote(uint64_t slot, uint64_t* bytes, bool* round_waits) {
  const ObjectIndex& index = host_.index();
  const IndexEntry& e = index.entry(slot);
  uint64_t sg = e.state_gen.load(std::memory_order_acquire);
  if (StateOf(sg) != EntryState::kComplete) return 0;
  // An unsettled upsert leaves older values: those go as without a tier
  // (the newest stays readable, from the tier).
  std::vector<uint64_t> live;
  host_.FindLive(host_.KeyOf(slot), e.key_hash.load(std::memory_order_relaxed), &live);
  for (uint64_t s : live)
    if (s != slot && Readable(StateOf(index.entry(s).state_gen.load(std::memory_order_acquire))) &&
        GenOf(index.entry(s).state_gen.load(std::memory_order_relaxed)) < GenOf(sg))
      return host_.UnlinkWithOlder(slot, bytes);
  auto it = disk_loc_.find(slot);
  if (it != disk_loc_.end()) {
    if (!Convert(slot, it->second, bytes)) return 0;
    ++counters_.demotions_clean;  // its copy was there: nothing written on the put path
    return 1;
  }
  auto nd = no_disk_.find(slot);
  if (nd != no_disk_.end() && nd->second == sg) return host_.UnlinkWithOlder(slot, bytes);
  if (host_.NewerWriting(slot)) {  // an upsert in flight decided without a record of this value: later
    *round_waits = true;
    return 0;
  }
  if (config_.offload_force_evict && demote_queued_.count(slot) == 0 &&
      demote_q_.size() >= config_.offloading_queue_limit) {
    ++counters_.offload_skipped;  // the disk is behind: evicted as without a tier
    return host_.UnlinkWithOlder(slot, bytes);
  }
  // On its way to the disk: its bytes count for this round, so that a round
  // queues about what it needs, not every candidate it sees.
  Extent ext;
  if (host_.alloc().Lookup(host_.Record(slot).extent, &ext)) {
    if (bytes != nullptr) *bytes += ext.size;
    if (evict_pending_.emplace(slot, ext.size).second) evict_pending_bytes_ += ext.size;
  }
  QueueDemote(slot, true);
  *round_waits = true;
  return 0;
}

void TierManager::OnPutComplete(uint64_t slot) {
  if (!config_.offload_on_evict) QueueDemote(slot, false);  // write-through: a copy after each put
}

void TierManager::QueueDemote(uint64_t slot, bool evict) {
  auto it = demote_queued_.find(slot);
  if (it != demote_queued_.end()) {
    it->second = it->second || evict;
    return;
  }
  uint64_t sg = host_.index().entry(slot).state_gen.load(std::memory_order_acquire);
  demote_queued_[slot] = evict;
  demote_q_.push_back({slot, sg, evict});
  Wake();
}

bool TierManager::Convert(uint64_t slot, const tier::RecordLocation& loc, uint64_t* bytes) {
  if (!host_.ConvertToDisk(slot, loc, bytes)) return false;
  NoteClean(loc.value_len, false);  // no longer a pool object
  ResolvePending(slot);
  ++disk_objects_;
  ++counters_.demotions;
  return true;
}

void TierManager::ResolvePending(uint64_t slot) {
  auto it = evict_pending_.find(slot);
  if (it == evict_pending_.end()) return;
  evict_pending_bytes_ -= std::min(evict_pending_bytes_, it->second);
  evict_pending_.erase(it);
}

bool TierManager::TakeOverFree(uint64_t handle) {
  auto bd = busy_demote_.find(handle);
  if (bd == busy_demote_.end()) return false;
  bd->second = true;  // in the demotion batch being written: the tier thread frees it
  return true;
}

void TierManager::NoteClean(uint64_t value_len, bool add) {
  if (add) pool_clean_bytes_ += value_len;
  else pool_clean_bytes_ -= std::min(pool_clean_bytes_, value_len);
}

bool TierManager::DemoteBatch() {
  // Taken together: up to kBatchBytes of queued jobs under one hold of the
  // lock, one AppendBatch (one pwrite per ~4 MiB), one pass converting them.
  constexpr uint64_t kBatchBytes = 4ull << 20;
  constexpr size_t kBatchJobs = 512;
  std::vector<DemoteItem> batch;
  uint64_t batch_bytes = 0;
  bool more = false;
  {
    std::lock_guard<FencedMutex> lock(host_.mu());
    if (demote_q_.empty() || host_.pool_lost()) return false;
    const ObjectIndex& index = host_.index();
    size_t taken = 0;
    for (; taken < demote_q_.size() && batch_bytes < kBatchBytes && batch.size() < kBatchJobs; ++taken) {
      DemoteJob job = demote_q_[taken];
      auto q = demote_queued_.find(job.slot);
      if (q != demote_queued_.end()) {
        job.evict = job.evict || q->second;
        demote_queued_.erase(q);
      }
      const IndexEntry& e = index.entry(job.slot);
      if (e.state_gen.load(std::memory_order_acquire) != job.state_gen ||
          StateOf(job.state_gen) != EntryState::kComplete || !host_.Record(job.slot).live ||
          !host_.CheckedLive(job.slot)) {
        if (e.state_gen.load(std::memory_order_acquire) == job.state_gen) ResolvePending(job.slot);
        continue;  // gone or changed since it was queued
      }
      auto have = disk_loc_.find(job.slot);
      if (have != disk_loc_.end()) {  // copied already (write-through, ahead, or promoted)
        if (job.evict) {
          uint64_t b = 0;
          (void)Convert(job.slot, have->second, &b);
        }
        ResolvePending(job.slot);
        continue;
      }
      if (host_.NewerWriting(job.slot)) continue;  // an upsert decided its settle without this record
      if (full_ && job.evict) {  // no room even after dropping the tier's LRU: evict as without a tier
        no_disk_[job.slot] = job.state_gen;
        ResolvePending(job.slot);
        host_.DropGroup(job.slot);  // its group was evicted with it: not split across the tiers
        continue;
      }
      size_t had = batch.size();
      AddToDemoteBatch(job, &batch, &batch_bytes);
      if (batch.size() == had) ResolvePending(job.slot);  // its extent is busy elsewhere: eviction queues it again
    }
    demote_q_.erase(demote_q_.begin(), demote_q_.begin() + taken);
    more = true;  // jobs were taken: the loop comes back for the rest
  }
  if (batch.empty()) return more;
  WriteDemoteBatch(&batch, false);
  return true;
}

void TierManager::AddToDemoteBatch(const DemoteJob& job, std::vector<DemoteItem>* batch, uint64_t* batch_bytes) {
  const TierHost::EntryRecord r = host_.Record(job.slot);
  const char* src = host_.ValueBytes(job.slot);
  if (src == nullptr || busy_demote_.count(r.extent)) return;
  // CheckedLive: the value fits the extent.
  uint64_t len = host_.index().entry(job.slot).value_size.load(std::memory_order_relaxed);
  batch->push_back({job, std::string(host_.KeyOf(job.slot)), src, len, r.extent});
  busy_demote_[r.extent] = false;
  *batch_bytes += len;
}

void TierManager::WriteDemoteBatch(std::vector<DemoteItem>* batch_in, bool ahead) {
  std::vector<DemoteItem>& batch = *batch_in;
  // The bytes are stable: the objects are COMPLETE and their extents are kept for us.
  std::vector<tier::DiskTier::BatchItem> items;
  items.reserve(batch.size());
  for (const DemoteItem& it : batch) items.push_back({it.key, it.src, it.len, GenOf(it.job.state_gen)});
  if (test_write_delay_ms_ != 0) std::this_thread::sleep_for(std::chrono::milliseconds(test_write_delay_ms_));
  auto locs = disk_->AppendBatch(items);
  tier::Stats ts = disk_->stats();
  std::lock_guard<FencedMutex> lock(host_.mu());
  disk_stats_ = ts;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DemoteItem& it = batch[i];
    const DemoteJob& job = it.job;
    auto bd = busy_demote_.find(it.handle);
    bool freed = bd != busy_demote_.end() && bd->second;
    if (bd != busy_demote_.end()) busy_demote_.erase(bd);
    if (freed) host_.FreeWhenUnpinned(it.handle, GenOf(job.state_gen));  // unlinked while we read
    const TierHost::EntryRecord r = host_.Record(job.slot);
    bool same = host_.index().entry(job.slot).state_gen.load(std::memory_order_acquire) == job.state_gen &&
                r.live && r.extent == it.handle;
    if (!ahead && same) ResolvePending(job.slot);  // converted below, or marked no_disk_
    const auto& loc = locs[i];
    if (!loc) {
      ++counters_.demotion_failures;
      // A copy ahead of eviction that failed: eviction tries again itself
      // (and drops the object when that fails too); meanwhile no more ahead.
      if (ahead) {
        pre_retry_mono_ = MonoNs() + 100 * 1000000ull;
      } else {
        if (same) no_disk_[job.slot] = job.state_gen;
        if (same && job.evict) host_.DropGroup(job.slot);  // not split across the tiers
      }
      uint64_t now = MonoNs();
      if (now - full_log_mono_ > kNsPerSec) {
        full_log_mono_ = now;
        MCXL_LOG(kWarn, "tier", "append of '%s' (%llu bytes) to the SSD tier failed (%s); %s", it.key.c_str(),
                 (unsigned long long)it.len, ErrorCodeName(loc.error()),
                 ahead ? "eviction will try again" : "eviction drops it");
      }
      if (loc.error() == ErrorCode::NO_AVAILABLE_HANDLE) full_ = true;
      continue;
    }
    ++counters_.tier_writes;
    if (ahead) ++counters_.tier_ahead_writes;
    if (!same) {  // removed or replaced meanwhile: the record must not come back
      ++counters_.tier_stale_copies;
      QueueTombstone(it.key, GenOf(job.state_gen));
      continue;
    }
    disk_loc_[job.slot] = *loc;
    NoteClean(loc->value_len, true);  // a COMPLETE object (same): a clean copy now
    if (job.evict) {
      uint64_t b = 0;
      (void)Convert(job.slot, *loc, &b);
    }
  }
}

}  // namespace mcxl
