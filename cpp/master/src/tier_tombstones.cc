// Removal in the tier: the record of an unlinked entry gets a tombstone,
// written durably by the tier thread before the remove's ticket is
// published; puts and upserts that must wait for one are told to settle.
// Contract in tier_manager.h ("Removal").
//
// Atomics follow the three rules stated in master_impl.h.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "tier_manager.h"

namespace mcxl {

void TierManager::ForgetDiskCopy(uint64_t slot, uint64_t generation) {
  ResolvePending(slot);  // unlinked: its bytes are free now
  uint64_t sg = host_.index().entry(slot).state_gen.load(std::memory_order_relaxed);
  if (StateOf(sg) == EntryState::kOnDisk && disk_objects_ > 0) --disk_objects_;
  promote_count_.erase(slot);
  no_disk_.erase(slot);
  auto it = disk_loc_.find(slot);
  if (it == disk_loc_.end()) {
    // Being appended right now (a demotion batch): its record lands before
    // the tier thread's next tombstone flush, which then hides it.
    const TierHost::EntryRecord r = host_.Record(slot);
    if (r.live && busy_demote_.count(r.extent)) QueueTombstone(std::string(host_.KeyOf(slot)), generation);
    return;
  }
  if (StateOf(sg) != EntryState::kOnDisk) NoteClean(it->second.value_len, false);
  disk_loc_.erase(it);
  QueueTombstone(std::string(host_.KeyOf(slot)), generation);
}

void TierManager::QueueTombstone(std::string key, uint64_t generation) {
  uint64_t seq = ++tomb_queued_;
  tomb_pending_[key] = seq;
  removals_.push_back({std::move(key), generation, seq});
  Wake();
}

uint64_t TierManager::PendingTomb(std::string_view key) const {
  if (tomb_pending_.empty()) return 0;
  auto it = tomb_pending_.find(std::string(key));
  return it == tomb_pending_.end() ? 0 : it->second;
}

bool TierManager::FlushTombstones() {
  std::vector<TierRemoval> batch;
  uint64_t upto = 0;  // every tombstone queued so far is in `batch` or written before
  {
    std::lock_guard<FencedMutex> lock(host_.mu());
    if (removals_.empty() || MonoNs() < tomb_retry_mono_) return false;  // backing off a full filesystem
    batch.swap(removals_);
    upto = tomb_queued_;
  }
  // Test hook (tests/tier/test_tier_tombstones.py): a slow tier, so that a reply
  // sent before its tombstone is written would lose the race for sure.
  static const uint64_t delay_ms = [] {
    const char* v = getenv("MCXL_TIER_TEST_TOMB_DELAY_MS");
    return v != nullptr ? strtoull(v, nullptr, 10) : 0ull;
  }();
  if (delay_ms != 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  std::vector<std::pair<std::string_view, uint64_t>> items;
  items.reserve(batch.size());
  for (const TierRemoval& r : batch) items.emplace_back(r.key, r.generation);
  std::vector<Status> st = disk_->RemoveBatch(items);  // group commit: one pwrite per ~4 MiB
  std::lock_guard<FencedMutex> lock(host_.mu());
  // Durable up to just before the first failure; failures are retried next
  // round (in front: older tickets first).
  std::vector<TierRemoval> again;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (st[i].ok() || st[i].error() == ErrorCode::INVALID_PARAMS) continue;
    if (batch[i].seq != 0) upto = std::min(upto, batch[i].seq - 1);
    uint64_t now = MonoNs();
    if (now - tomb_fail_log_mono_ > kNsPerSec) {
      tomb_fail_log_mono_ = now;
      MCXL_LOG(kWarn, "tier", "tombstone of '%s' not written (%s); retried (its remove waits)", batch[i].key.c_str(),
               ErrorCodeName(st[i].error()));
    }
    again.push_back(batch[i]);
  }
  counters_.tomb_retries += again.size();
  tomb_backoff_ns_ = again.empty() ? 0 : std::clamp<uint64_t>(2 * tomb_backoff_ns_, 50000000ull, 2 * kNsPerSec);
  tomb_retry_mono_ = again.empty() ? 0 : MonoNs() + tomb_backoff_ns_;
  for (const TierRemoval& r : batch) {
    auto p = tomb_pending_.find(r.key);
    if (p != tomb_pending_.end() && p->second <= upto) tomb_pending_.erase(p);
  }
  if (!again.empty()) removals_.insert(removals_.begin(), again.begin(), again.end());
  if (upto > host_.TombsDurable()) host_.PublishTombsDurable(upto);
  return again.size() < batch.size();
}

bool TierManager::OlderHasRecord(std::string_view key, uint64_t hash, uint64_t generation) const {
  std::vector<uint64_t> live;
  host_.FindLive(key, hash, &live);
  for (uint64_t s : live) {
    uint64_t sg = host_.index().entry(s).state_gen.load(std::memory_order_acquire);
    if (GenOf(sg) >= generation) continue;
    if (disk_loc_.count(s) || demote_queued_.count(s) || busy_demote_.count(host_.Record(s).extent)) return true;
  }
  return false;
}

bool TierManager::PutNeedsSettle(std::string_view key, uint64_t hash, uint64_t gen, bool upsert) const {
  // An older value with a record on disk, or a tombstone of the key not yet
  // written: the old record is tombstoned durably before the put returns.
  return (upsert && OlderHasRecord(key, hash, gen)) || PendingTomb(key) != 0;
}

}  // namespace mcxl
