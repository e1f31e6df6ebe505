// Promotion: kPromote (a reader's disk read, counted toward admission, or a
// stage request) queues an object with its group; the tier thread copies it
// back into the pool (PromoteOne). Contract in tier_manager.h ("Promotion").
//
// Atomics follow the three rules stated in master_impl.h.
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "tier_manager.h"

namespace mcxl {

ErrorCode TierManager::Promote(const PromoteRequest& req) {
  const ObjectIndex& index = host_.index();
  std::vector<uint64_t> live;
  host_.FindLive(req.key, KeyHash(req.key), &live);
  for (uint64_t s : live) {
    uint64_t sg = index.entry(s).state_gen.load(std::memory_order_acquire);
    if (GenOf(sg) != req.generation) continue;
    if (StateOf(sg) != EntryState::kOnDisk) return ErrorCode::OK;  // already in the pool
    if (!req.stage) {
      // A disk read: counted toward admission.
      ++counters_.disk_hits_reported;
      if (!config_.promotion_on_hit) return ErrorCode::OK;
      auto& c = promote_count_[s];
      if (c.first != sg) c = {sg, 0};
      if (++c.second < config_.promotion_admission_threshold) return ErrorCode::OK;
    }
    QueuePromoteWithGroup(s, sg);
    return ErrorCode::OK;
  }
  return ErrorCode::OBJECT_NOT_FOUND;
}

void TierManager::QueuePromoteWithGroup(uint64_t slot, uint64_t state_gen) {
  auto queue = [this](uint64_t s, uint64_t sg) {
    if (promote_queued_.count(s) != 0) return;
    promote_queued_[s] = sg;
    promote_q_.push_back({s, sg});
  };
  queue(slot, state_gen);
  // Its group (K and V, TP shards: put with one group id) comes back with
  // it, as eviction takes them out together: the members still on disk,
  // at most kGroupPromoteMax of them (a huge group must not flood the queue).
  size_t n = 0;
  for (uint64_t m : host_.GroupMembers(slot)) {
    if (m == slot || !host_.Record(m).live || disk_loc_.count(m) == 0) continue;
    uint64_t msg = host_.index().entry(m).state_gen.load(std::memory_order_acquire);
    if (StateOf(msg) != EntryState::kOnDisk) continue;
    if (++n > kGroupPromoteMax) break;
    queue(m, msg);
    ++counters_.group_promotions;
  }
  Wake();
}

bool TierManager::PromoteOne() {
  PromoteJob job{};
  std::string key;
  tier::RecordLocation loc{};
  TierHost::PromotionTarget target;
  uint64_t value_size = 0;
  {
    std::lock_guard<FencedMutex> lock(host_.mu());
    if (promote_q_.empty() || host_.pool_lost()) return false;
    job = promote_q_.front();
    promote_q_.erase(promote_q_.begin());
    promote_queued_.erase(job.slot);
    const IndexEntry& e = host_.index().entry(job.slot);
    auto it = disk_loc_.find(job.slot);
    if (e.state_gen.load(std::memory_order_acquire) != job.state_gen || it == disk_loc_.end() ||
        !host_.Record(job.slot).live || !host_.CheckedLive(job.slot))
      return true;
    loc = it->second;
    key.assign(host_.KeyOf(job.slot));
    value_size = e.value_size.load(std::memory_order_relaxed);
    auto a = host_.AllocateForPromotion(job.slot);
    if (!a) {
      // Demotions queued by the master's eviction round free room shortly:
      // try again (a stage request waits for it) for about 20 s of tier-loop
      // rounds.
      if (++job.attempts < 400) {
        promote_queued_[job.slot] = job.state_gen;
        promote_q_.push_back(job);
      } else {
        ++counters_.promotion_failures;
      }
      return false;
    }
    target = *a;
  }
  // The new extent is ours alone until linked.
  Status st = tier::ReadRecord(config_.root_fs_dir, loc, key, target.value, value_size);
  std::lock_guard<FencedMutex> lock(host_.mu());
  auto it = disk_loc_.find(job.slot);
  bool same = host_.index().entry(job.slot).state_gen.load(std::memory_order_acquire) == job.state_gen &&
              it != disk_loc_.end() && it->second.segment_id == loc.segment_id &&
              it->second.offset == loc.offset && host_.Record(job.slot).live;
  if (!st.ok() || !same) {
    host_.FreeExtent(target.extent.handle);
    ++counters_.promotion_failures;
    if (!st.ok() && same) {
      // The record is unreadable (checksum, or gone): the object is lost;
      // its entry goes (a miss from now on, never wrong bytes).
      ++counters_.tier_checksum_failures;
      MCXL_LOG(kError, "tier", "record of '%s' cannot be read back (%s): the object is dropped", key.c_str(),
               ErrorCodeName(st.error()));
      host_.UnlinkNow(job.slot);
    }
    return true;
  }
  host_.LinkPromoted(job.slot, target.extent);
  if (disk_objects_ > 0) --disk_objects_;
  NoteClean(loc.value_len, true);  // a pool object again, its record a clean copy
  promote_count_.erase(job.slot);
  ++counters_.promotions;
  return true;
}

}  // namespace mcxl
