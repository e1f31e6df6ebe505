// The tier at a restart and under compaction: entries and records are made
// to agree (Recover; after --format the index is rebuilt from the segment
// files), and a record compaction moved or dropped is followed (OnRelocated).
// Contract in tier_manager.h ("Restart").
//
// Atomics follow the three rules stated in master_impl.h.
#include <unordered_map>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "tier_manager.h"

namespace mcxl {

void TierManager::Recover(bool fresh) {
  std::unordered_map<std::string, tier::RecordLocation> live;
  disk_->ForEachLive([&live](std::string_view key, const tier::RecordLocation& loc) { live[std::string(key)] = loc; });
  host_.ReserveGeneration(disk_->MaxGeneration());
  // Tickets continue above the last incarnation's (0 in a formatted pool).
  tomb_queued_ = host_.TombsDurable();
  uint64_t kept = 0, dropped = 0, rebuilt = 0, orphans = 0;
  if (!fresh) {
    const ObjectIndex& index = host_.index();
    for (uint64_t s = 0; s < index.capacity(); ++s) {
      if (!host_.Record(s).live) continue;
      uint64_t sg = index.entry(s).state_gen.load(std::memory_order_acquire);
      if (!Readable(StateOf(sg))) continue;
      std::string key(host_.KeyOf(s));
      auto it = live.find(key);
      if (it != live.end() && it->second.generation == GenOf(sg)) {
        disk_loc_[s] = it->second;
        if (StateOf(sg) == EntryState::kOnDisk) {
          host_.RewriteStub(s, it->second);  // the stub says what the tier says
          ++disk_objects_;
          ++kept;
        } else {
          NoteClean(it->second.value_len, true);  // a pool object with a clean copy
        }
        live.erase(it);
      } else if (StateOf(sg) == EntryState::kOnDisk) {
        MCXL_LOG(kWarn, "tier", "recovery: '%s' is on disk in the index but its record is gone; dropped", key.c_str());
        host_.UnlinkNow(s);
        ++dropped;
      }
    }
    // Records no entry names (a demotion caught by a crash, a removal whose
    // tombstone was not written): tombstoned, so a rebuild never brings them back.
    for (const auto& [k, loc] : live) {
      QueueTombstone(k, loc.generation);
      ++orphans;
    }
  } else {
    uint64_t now = NowNs();
    for (const auto& [key, loc] : live) {
      if (key.empty() || key.size() > kMaxKeyLength || loc.value_len == 0) continue;
      auto slot = host_.InsertOnDisk(key, loc, now);
      if (!slot) {
        ++dropped;
        continue;
      }
      disk_loc_[*slot] = loc;
      ++disk_objects_;
      ++rebuilt;
    }
    counters_.tier_rebuilt = rebuilt;
  }
  disk_stats_ = disk_->stats();
  MCXL_LOG(kInfo, "tier", "SSD tier %s: %llu objects on disk%s, %llu dropped, %llu orphan records to tombstone",
           fresh ? "rebuilt into a formatted pool" : "recovered", (unsigned long long)(fresh ? rebuilt : kept),
           fresh ? " (index entries made from the segment files)" : "", (unsigned long long)dropped,
           (unsigned long long)orphans);
}

void TierManager::OnRelocated(std::string_view key, const tier::RecordLocation& from,
                              const tier::RecordLocation& to) {
  // The tier thread, inside Compact: without the lock (see Locking).
  std::lock_guard<FencedMutex> lock(host_.mu());
  std::vector<uint64_t> live;
  host_.FindLive(key, KeyHash(key), &live);
  for (uint64_t s : live) {
    auto it = disk_loc_.find(s);
    if (it == disk_loc_.end() || it->second.segment_id != from.segment_id || it->second.offset != from.offset ||
        it->second.generation != from.generation)
      continue;
    uint64_t sg = host_.index().entry(s).state_gen.load(std::memory_order_acquire);
    if (to.segment_id == 0) {  // the record failed its checksum and was dropped
      ++counters_.tier_checksum_failures;
      if (StateOf(sg) == EntryState::kOnDisk) {
        MCXL_LOG(kError, "tier", "record of '%.*s' failed its checksum in compaction: the object is dropped",
                 int(key.size()), key.data());
        host_.UnlinkNow(s);
      } else {
        NoteClean(it->second.value_len, false);
        disk_loc_.erase(it);  // a pool object: only its clean copy is gone
      }
      continue;
    }
    it->second = to;
    if (StateOf(sg) == EntryState::kOnDisk) host_.RewriteStub(s, to);  // readers holding the old location retry
  }
}

}  // namespace mcxl
