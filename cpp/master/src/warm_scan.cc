// WarmScan (warm_scan.h): a standby's read-only pass over the index and the
// headers of COMPLETE objects.
#include "mooncake_cxl/master/warm_scan.h"

#include <algorithm>
#include <chrono>

#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/object_index.h"

namespace mcxl {

bool WarmScan::Scan(const Pool& pool) {
  ObjectIndex index(&pool);
  uint64_t capacity = index.capacity();
  std::vector<Seen> seen;
  seen.reserve(seen_.size() + 1024);
  constexpr uint64_t kHeaderPrefetch = 16;  // as in Recover: overlaps the headers' misses
  for (uint64_t slot = 0; slot < capacity; ++slot) {
    if ((slot & 4095) == 0 && stop_.load(std::memory_order_relaxed)) return false;
    if (slot + kHeaderPrefetch < capacity) {
      uint64_t ahead = index.entry(slot + kHeaderPrefetch).object_offset.load(std::memory_order_relaxed);
      if (ahead != 0 && pool.InDataRegion(ahead, sizeof(ObjectHeader))) __builtin_prefetch(pool.At<const char>(ahead));
    }
    IndexEntry& e = index.entry(slot);
    // Acquire: pairs with the publishing release, so the header read after it
    // is the one written before the entry became COMPLETE (same host or not:
    // Find re-checks the state word at takeover either way).
    uint64_t sg = e.state_gen.load(std::memory_order_acquire);
    if (StateOf(sg) != EntryState::kComplete) continue;
    // Relaxed (offset, hash, size): checked against the header, and the state
    // word re-read below; Recover compares them again at takeover.
    uint64_t off = e.object_offset.load(std::memory_order_relaxed);
    ObjectHeader h;
    if (!CheckedObjectHeader(pool, off, &h) || h.key_hash != e.key_hash.load(std::memory_order_relaxed) ||
        h.value_size != e.value_size.load(std::memory_order_relaxed) || h.generation != GenOf(sg))
      continue;
    // The entry must not have moved on while its header was read.
    if (e.state_gen.load(std::memory_order_acquire) != sg ||
        e.object_offset.load(std::memory_order_relaxed) != off)
      continue;
    seen.push_back(Seen{slot, sg, off, h});
  }
  std::vector<ByOffset> by_offset(seen.size());
  std::vector<ByHash> by_hash(seen.size());
  for (uint32_t i = 0; i < seen.size(); ++i) {
    by_offset[i] = ByOffset{seen[i].offset, i};
    by_hash[i] = ByHash{seen[i].header.key_hash, seen[i].slot, i};
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const ByOffset& a, const ByOffset& b) { return a.offset < b.offset; });
  std::sort(by_hash.begin(), by_hash.end(), [](const ByHash& a, const ByHash& b) {
    return a.key_hash != b.key_hash ? a.key_hash < b.key_hash : a.slot < b.slot;
  });
  seen_ = std::move(seen);
  by_offset_ = std::move(by_offset);
  by_hash_ = std::move(by_hash);
  cursor_ = 0;
  return true;
}

void WarmScan::Start(const Pool* pool, uint32_t period_ms) {
  thread_ = std::thread([this, pool, period_ms] {
    while (!stop_.load(std::memory_order_relaxed)) {
      for (uint32_t waited = 0; waited < period_ms && !stop_.load(std::memory_order_relaxed); waited += 10)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!stop_.load(std::memory_order_relaxed)) (void)Scan(*pool);
    }
  });
}

void WarmScan::Stop() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

uint32_t WarmScan::Find(uint64_t slot, uint64_t state_gen, uint64_t offset) {
  while (cursor_ < seen_.size() && seen_[cursor_].slot < slot) ++cursor_;
  if (cursor_ >= seen_.size() || seen_[cursor_].slot != slot) return kNone;
  const Seen& s = seen_[cursor_];
  return s.state_gen == state_gen && s.offset == offset ? uint32_t(cursor_) : kNone;
}

}  // namespace mcxl
