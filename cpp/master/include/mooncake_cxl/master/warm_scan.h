// WarmScan: what a standby learns from the pool while it waits, so that the
// recovery it runs once elected re-reads only the object headers of entries
// that changed since.
//
// Contract:
//   * Scan only reads the pool. It remembers an entry only when the entry was
//     COMPLETE and its object header checked out (CheckedObjectHeader, and the
//     entry's key hash, value size and generation match the header).
//   * Find(slot, state_gen, offset) returns that header copy's index only when the
//     entry's state word (state and generation) and offset are exactly those
//     seen. That is as good as reading the header again: generations are never
//     reused (each put takes a new one), and the header of a COMPLETE object
//     stays as written until its entry leaves COMPLETE (its extent is freed
//     only after the entry is unlinked, which changes the state word).
//     Recovery still checks everything else as a cold recovery does.
//   * Start runs Scan again every `period_ms` on a thread of its own until
//     Stop, which returns within a few thousand entries' scan; an interrupted
//     scan keeps the previous complete one. Find is used only after Stop.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "mooncake_cxl/pool/layout.h"
#include "mooncake_cxl/pool/pool.h"

namespace mcxl {

class WarmScan {
 public:
  ~WarmScan() { Stop(); }
  // False when stopped midway (what was seen before stays).
  bool Scan(const Pool& pool);
  void Start(const Pool* pool, uint32_t period_ms);
  void Stop();
  // The index of what was seen of `slot` (kNone: nothing usable).
  static constexpr uint32_t kNone = ~0u;
  uint32_t Find(uint64_t slot, uint64_t state_gen, uint64_t offset);
  const ObjectHeader& header(uint32_t i) const { return seen_[i].header; }
  size_t size() const { return seen_.size(); }

  // What was seen, sorted (by the standby, off the takeover's path) the two
  // ways Recover needs: by offset, and by (key hash, slot).
  struct ByOffset {
    uint64_t offset;
    uint32_t seen;
  };
  struct ByHash {
    uint64_t key_hash, slot;
    uint32_t seen;
  };
  const std::vector<ByOffset>& by_offset() const { return by_offset_; }
  const std::vector<ByHash>& by_hash() const { return by_hash_; }

 private:
  struct Seen {
    uint64_t slot, state_gen, offset;
    ObjectHeader header;
  };
  std::vector<Seen> seen_;  // by slot
  std::vector<ByOffset> by_offset_;
  std::vector<ByHash> by_hash_;
  size_t cursor_ = 0;       // Find is called with growing slots
  std::atomic<bool> stop_{false};  // relaxed: a request to stop, joined after
  std::thread thread_;
};

}  // namespace mcxl
