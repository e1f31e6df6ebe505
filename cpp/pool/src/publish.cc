#include "mooncake_cxl/pool/publish.h"

#include <immintrin.h>

#include <cstdint>

namespace mcxl {
namespace {
// Relaxed: written once at attach, before any pool access by this process.
std::atomic<uint32_t> g_mode{uint32_t(CoherenceMode::kCoherent)};
}  // namespace

void SetCoherenceMode(CoherenceMode mode) {
  g_mode.store(uint32_t(mode), std::memory_order_relaxed);
}

CoherenceMode GetCoherenceMode() {
  return CoherenceMode(g_mode.load(std::memory_order_relaxed));
}

void FlushRangeForOtherHosts(const void* p, size_t n) {
  auto start = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(kCacheLine - 1);
  auto end = reinterpret_cast<uintptr_t>(p) + n;
  for (uintptr_t a = start; a < end; a += kCacheLine)
    _mm_clflush(reinterpret_cast<const void*>(a));
  _mm_mfence();
}

}  // namespace mcxl
