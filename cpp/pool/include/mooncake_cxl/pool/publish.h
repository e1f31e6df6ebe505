// The one helper for every cross-process publish and observe (docs/architecture.md §7).
//
// Contract: a writer that stores plain bytes another process will read calls
// PublishRange on them before the release store that announces them; a reader
// calls ObserveRange before reading plain bytes another process announced.
// In coherent mode (one host, CXL 3.x) these are fences only; in non-coherent
// mode (CXL 2.0 multi-host) they write back / invalidate the cache lines.
// Nothing else in the code base issues flushes or fences for pool data.
#pragma once

#include <atomic>
#include <cstddef>

#include "mooncake_cxl/pool/layout.h"

namespace mcxl {

// Process-wide; set once when the pool is attached.
void SetCoherenceMode(CoherenceMode mode);
CoherenceMode GetCoherenceMode();

// Writes back the cache lines of [p, p+n) (non-coherent mode only).
void FlushRangeForOtherHosts(const void* p, size_t n);

inline void PublishRange(const void* p, size_t n) {
  if (GetCoherenceMode() == CoherenceMode::kNonCoherent) FlushRangeForOtherHosts(p, n);
  // Release: the announcing store that follows cannot pass the data stores.
  std::atomic_thread_fence(std::memory_order_release);
}

inline void ObserveRange(const void* p, size_t n) {
  if (GetCoherenceMode() == CoherenceMode::kNonCoherent) FlushRangeForOtherHosts(p, n);
  // Acquire: the data loads that follow cannot move before the observing load.
  std::atomic_thread_fence(std::memory_order_acquire);
}

}  // namespace mcxl
